//go:build linux && !amd64 && !arm64

package seccomp

// nativeArch 0: there is no filter for this architecture (Build fails).
const nativeArch = 0

const x32Bit = 0

var archDenied = []Syscall{}
