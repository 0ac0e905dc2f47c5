//go:build embedkernel && arm64

package embedded

import _ "embed" // for go:embed

// compressed is the gzip-compressed arm64 guest Image the Makefile put here.
//
//go:embed Image-arm64.gz
var compressed []byte
