//go:build !embedkernel

package embedded

// compressed is empty: this binary was built without the embedkernel tag.
var compressed []byte
