package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Syscall names a system call (or an ioctl request) by its native number.
type Syscall struct {
	Name string
	Nr   uint32
}

// Offsets in struct seccomp_data: nr, arch, instruction_pointer, args[6].
// An argument's low 32 bits are the first word of its 8 bytes on the
// little-endian architectures this package builds for.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

func argLow(i uint32) uint32 { return offArgs + 8*i }

// Verdicts.
const (
	retAllow = unix.SECCOMP_RET_ALLOW
	retDeny  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	// retKill ends the whole process (Linux 4.14; older kernels treat an
	// action they do not know as a kill of the thread).
	retKill = unix.SECCOMP_RET_KILL_PROCESS
)

// maxInstructions is the kernel's BPF_MAXINSNS.
const maxInstructions = 4096

// denied are the calls refused on every architecture (see doc.go).
var denied = []Syscall{
	{"keyctl", unix.SYS_KEYCTL},
	{"add_key", unix.SYS_ADD_KEY},
	{"request_key", unix.SYS_REQUEST_KEY},
	{"syslog", unix.SYS_SYSLOG},
	{"acct", unix.SYS_ACCT},
	{"quotactl", unix.SYS_QUOTACTL},
	{"quotactl_fd", unix.SYS_QUOTACTL_FD},
	{"swapon", unix.SYS_SWAPON},
	{"swapoff", unix.SYS_SWAPOFF},
	{"reboot", unix.SYS_REBOOT},
	{"init_module", unix.SYS_INIT_MODULE},
	{"finit_module", unix.SYS_FINIT_MODULE},
	{"delete_module", unix.SYS_DELETE_MODULE},
	{"kexec_load", unix.SYS_KEXEC_LOAD},
	{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"settimeofday", unix.SYS_SETTIMEOFDAY},
	{"clock_settime", unix.SYS_CLOCK_SETTIME},
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT},
	{"bpf", unix.SYS_BPF},
	{"userfaultfd", unix.SYS_USERFAULTFD},
	{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE},
	{"vhangup", unix.SYS_VHANGUP},
	{"nfsservctl", unix.SYS_NFSSERVCTL},
}

// deniedIoctls are the ioctl requests refused: both put bytes into a
// terminal's input (TIOCLINUX's paste, on a virtual console).
var deniedIoctls = []Syscall{
	{"TIOCSTI", unix.TIOCSTI},
	{"TIOCLINUX", unix.TIOCLINUX},
}

// allowedPersonalities are personality(2)'s accepted arguments: Linux,
// 32-bit Linux (linux32, setarch) and the query 0xffffffff.
var allowedPersonalities = []uint32{0x0000, 0x0008, 0xffffffff}

// Denied lists the system calls the filter refuses whatever their
// arguments, for this architecture.
func Denied() []Syscall {
	return append(append([]Syscall(nil), denied...), archDenied...)
}

// DeniedIoctls lists the ioctl requests the filter refuses.
func DeniedIoctls() []Syscall { return append([]Syscall(nil), deniedIoctls...) }

// Summary is the filter in one line, for doctor and logs.
func Summary() string {
	var ioctls []string
	for _, r := range deniedIoctls {
		ioctls = append(ioctls, r.Name)
	}
	return fmt.Sprintf("%d system calls refused (keyctl, add_key and request_key among them), ioctl %s refused, personality changes refused; a call through another ABI kills the process",
		len(Denied()), strings.Join(ioctls, " and "))
}

// Program assembles the filter for this architecture.
func Program() ([]bpf.RawInstruction, error) {
	if nativeArch == 0 {
		return nil, fmt.Errorf("seccomp: no filter for %s", runtime.GOARCH)
	}
	var a assembler
	a.ins(bpf.LoadAbsolute{Off: offArch, Size: 4})
	a.jump(bpf.JumpEqual, nativeArch, "native", "")
	a.ins(bpf.RetConstant{Val: retKill})
	a.label("native")
	a.ins(bpf.LoadAbsolute{Off: offNr, Size: 4})
	if x32Bit != 0 {
		a.jump(bpf.JumpBitsSet, x32Bit, "deny", "")
	}
	for _, s := range Denied() {
		a.jump(bpf.JumpEqual, s.Nr, "deny", "")
	}
	a.jump(bpf.JumpEqual, unix.SYS_IOCTL, "ioctl", "")
	a.jump(bpf.JumpEqual, unix.SYS_PERSONALITY, "personality", "")
	a.ins(bpf.RetConstant{Val: retAllow})

	// ioctl(fd, request): the kernel takes request as an unsigned int, so
	// only its low 32 bits count.
	a.label("ioctl")
	a.ins(bpf.LoadAbsolute{Off: argLow(1), Size: 4})
	for _, r := range deniedIoctls {
		a.jump(bpf.JumpEqual, r.Nr, "deny", "")
	}
	a.ins(bpf.RetConstant{Val: retAllow})

	a.label("personality")
	a.ins(bpf.LoadAbsolute{Off: argLow(0), Size: 4})
	for _, p := range allowedPersonalities {
		a.jump(bpf.JumpEqual, p, "allow", "")
	}
	a.label("deny")
	a.ins(bpf.RetConstant{Val: retDeny})
	a.label("allow")
	a.ins(bpf.RetConstant{Val: retAllow})
	return a.assemble()
}

// Install puts prog on the calling thread, which must be locked
// (runtime.LockOSThread) and should be thrown away after it forks: the
// filter is the thread's, and every child forked from it inherits it. It
// sets no_new_privs on the thread first, which the kernel requires of a
// process without CAP_SYS_ADMIN and which an isolated spawn has anyway.
func Install(prog []bpf.RawInstruction) error {
	if len(prog) == 0 || len(prog) > maxInstructions {
		return fmt.Errorf("seccomp: a program of %d instructions cannot be installed", len(prog))
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, r := range prog {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: setting no_new_privs: %w", err)
	}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("seccomp: installing the filter: %w", errno)
	}
	return nil
}

// Supported says whether this kernel can install the filter: nil if it
// has seccomp's filter mode and knows the verdicts the filter returns.
func Supported() error {
	for _, action := range []uint32{retDeny &^ unix.SECCOMP_RET_DATA, retKill} {
		a := action
		_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&a)))
		switch {
		case errno == 0:
		case errno == unix.ENOSYS:
			return errors.New("the kernel has no seccomp (CONFIG_SECCOMP)")
		case errno == unix.EINVAL && action == retKill:
			// Before Linux 4.14: no such query; filter mode is there if
			// installing a filter fails on its address, not on the mode.
			return probeFilterMode()
		default:
			return fmt.Errorf("the kernel refuses seccomp action %#x: %w", action, errno)
		}
	}
	return nil
}

// probeFilterMode installs nothing: a nil program fails with EFAULT (or
// EACCES) where filter mode exists and EINVAL where it does not.
func probeFilterMode() error {
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, 0)
	if errno == unix.EFAULT || errno == unix.EACCES {
		return nil
	}
	return fmt.Errorf("the kernel has no seccomp filter mode (CONFIG_SECCOMP_FILTER): %w", errno)
}
