package seccomp

import "golang.org/x/sys/unix"

// nativeArch is seccomp_data.arch for this binary's system calls.
const nativeArch = unix.AUDIT_ARCH_AARCH64

// x32Bit: arm64 has no second ABI sharing its arch value.
const x32Bit = 0

// archDenied are the calls only this architecture has.
var archDenied = []Syscall{}
