package seccomp

import "golang.org/x/sys/unix"

// nativeArch is seccomp_data.arch for this binary's system calls.
const nativeArch = unix.AUDIT_ARCH_X86_64

// x32Bit marks a system call number of the x32 ABI, which shares
// nativeArch with x86-64's own.
const x32Bit = 0x40000000

// archDenied are the calls only this architecture has.
var archDenied = []Syscall{
	{"uselib", unix.SYS_USELIB},
	{"_sysctl", unix.SYS__SYSCTL},
	{"iopl", unix.SYS_IOPL},
	{"ioperm", unix.SYS_IOPERM},
	{"modify_ldt", unix.SYS_MODIFY_LDT},
}
