// Package embedded holds the guest kernel compiled into the cowork-vmm
// binary, so a user needs no separate kernel file. The kernel is embedded
// only when the binary is built with the embedkernel build tag, which the
// Makefile sets after copying the built kernel here gzip-compressed, the
// one for the binary's GOARCH: vmlinux.gz (amd64) or Image-arm64.gz (arm64),
// never committed. Without the tag Kernel reports ErrNotEmbedded and the VM
// backend looks for a kernel elsewhere.
package embedded
