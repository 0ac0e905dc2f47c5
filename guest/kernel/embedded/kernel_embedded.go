//go:build embedkernel && amd64

package embedded

import _ "embed" // for go:embed

// compressed is the gzip-compressed guest vmlinux the Makefile put here.
//
//go:embed vmlinux.gz
var compressed []byte
