package kvm

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds every use of unsafe in the package: passing Go structures
// to ioctl, storing immediate_exit into the shared kvm_run page and taking
// the address of the probe's guest memory.

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
// EINTR, which is how a kicked vCPU leaves the guest.
func runOnce(fd int) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), ioctlRun, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

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
