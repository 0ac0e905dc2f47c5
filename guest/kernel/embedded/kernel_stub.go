//go:build !embedkernel || !(amd64 || arm64)

package embedded

// compressed is empty: this binary was built without the embedkernel tag
// (or for an arch we build no guest kernel for).
var compressed []byte
