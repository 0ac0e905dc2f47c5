package kvm

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds every use of unsafe in the package: passing Go structures
// to ioctl (and the buffers some of them point to: a register's value, a
// device attribute's, the register list), storing immediate_exit into the shared kvm_run page, taking
// the address of the probe's guest memory and the two runtime functions
// blockingSyscall links to.

// ioctlValue issues an ioctl whose argument is an integer, retrying on EINTR.
func ioctlValue(fd int, req uintptr, arg uintptr) (uintptr, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return r, errno
		}
		return r, nil
	}
}

// ioctlPointer issues an ioctl whose argument points to a Go value, retrying
// on EINTR. The unsafe.Pointer is converted inside the Syscall expression so
// the value stays alive and in place for the duration of the call.
func ioctlPointer(fd int, req uintptr, arg unsafe.Pointer) (uintptr, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return r, errno
		}
		return r, nil
	}
}

// runOnce issues KVM_RUN once, without retrying on EINTR: the caller must see
// EINTR, which is how a kicked vCPU leaves the guest. It is a blocking
// system call (blockingSyscall): it returns only when the guest exits.
func runOnce(fd int) error {
	if _, errno := blockingSyscall(unix.SYS_IOCTL, uintptr(fd), ioctlRun, 0); errno != 0 {
		return errno
	}
	return nil
}

// blockingSyscall makes a system call that may block for long, as KVM_RUN
// does while the guest runs, and hands the thread's P (the Go scheduler's
// slot for running goroutines) to another thread at once: the runtime's
// entersyscallblock, which it keeps for this use (go.dev/issue/67401). An
// ordinary call (syscall.Syscall) keeps its P until sysmon takes it back,
// 20 µs to 10 ms later, and until then a goroutine the network poller woke
// (a device's, at an ioeventfd of the guest) has no P to run on: none at
// all with GOMAXPROCS 1, a one-CPU host's. BenchmarkBlockedThreadHandoff
// measures both; nested, the fs bench's 4 KiB random reads went from
// 0.46× to 0.58× qemu's virtio-9p and git status (cold) from 1.9× to 2.8×.
//
//go:nosplit
func blockingSyscall(trap, a1, a2, a3 uintptr) (uintptr, unix.Errno) {
	entersyscallblock()
	r, _, errno := unix.RawSyscall(trap, a1, a2, a3)
	exitsyscall()
	return r, errno
}

//go:linkname entersyscallblock runtime.entersyscallblock
func entersyscallblock()

//go:linkname exitsyscall runtime.exitsyscall
func exitsyscall()

// maxCPUIDEntries bounds the CPUID table exchanged with the kernel; current
// kernels report well under 100 entries.
const maxCPUIDEntries = 256

// cpuid2Arg mirrors struct kvm_cpuid2 with a fixed-size entry array.
type cpuid2Arg struct {
	Nent    uint32
	_       uint32
	Entries [maxCPUIDEntries]CPUIDEntry
}

// maxMSRs bounds one KVM_SET_MSRS / KVM_GET_MSRS call.
const maxMSRs = 64

// msrsArg mirrors struct kvm_msrs with a fixed-size entry array.
type msrsArg struct {
	Nmsrs   uint32
	_       uint32
	Entries [maxMSRs]MSR
}

func ioctlStruct[T any](fd int, req uintptr, arg *T) (uintptr, error) {
	return ioctlPointer(fd, req, unsafe.Pointer(arg))
}

// storeImmediateExit sets kvm_run.immediate_exit (byte 1 of the page) with an
// atomic 32-bit store of the first word; byte 0 (request_interrupt_window) is
// never set by this VMM, so writing it as 0 is harmless.
func storeImmediateExit(run []byte, on bool) {
	if len(run) < 4 {
		return
	}
	var v uint32
	if on {
		v = 1 << 8
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&run[0])), v)
}

// sliceAddress is the host virtual address of b's first byte, for
// KVM_SET_USER_MEMORY_REGION. b must stay mapped while KVM uses it.
func sliceAddress(b []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}

// oneRegArg mirrors struct kvm_one_reg (16 bytes on 64-bit hosts): the
// register id and the address of its value. Addr is a pointer, not an
// integer, so that the garbage collector keeps the buffer and the stack
// copier moves the address with it.
type oneRegArg struct {
	ID   uint64
	Addr unsafe.Pointer
}

// oneReg issues KVM_GET_ONE_REG or KVM_SET_ONE_REG with buf (non-empty, its
// length checked by the caller) as the value.
func oneReg(fd int, req uintptr, id uint64, buf []byte) error {
	arg := oneRegArg{ID: id, Addr: unsafe.Pointer(&buf[0])}
	_, err := ioctlStruct(fd, req, &arg)
	return err
}

// regList issues KVM_GET_REG_LIST (struct kvm_reg_list: a 64-bit count,
// then the ids) with room for len(ids) ids, and returns the count KVM
// reports: the number copied, or the number needed with E2BIG.
func regList(fd int, ids []uint64) (uint64, error) {
	arg := make([]uint64, 1+len(ids))
	arg[0] = uint64(len(ids))
	_, err := ioctlPointer(fd, ioctlGetRegList, unsafe.Pointer(&arg[0]))
	copy(ids, arg[1:])
	return arg[0], err
}

// createDeviceArg mirrors struct kvm_create_device (12 bytes).
type createDeviceArg struct {
	Type  uint32
	FD    uint32
	Flags uint32
}

// deviceAttrArg mirrors struct kvm_device_attr (24 bytes on 64-bit hosts).
// Addr is a pointer for the reason oneRegArg's is.
type deviceAttrArg struct {
	Flags uint32
	Group uint32
	Attr  uint64
	Addr  unsafe.Pointer
}

// deviceAttr issues one of the device attribute ioctls, with val (nil for
// none) as the value addr points to.
func deviceAttr(fd int, req uintptr, group uint32, attr uint64, val *uint64) error {
	arg := deviceAttrArg{Group: group, Attr: attr}
	if val != nil {
		arg.Addr = unsafe.Pointer(val)
	}
	_, err := ioctlStruct(fd, req, &arg)
	return err
}
