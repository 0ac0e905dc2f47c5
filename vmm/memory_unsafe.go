package vmm

import "unsafe"

// hostAddress returns the host virtual address of a region's mapping, which
// KVM_SET_USER_MEMORY_REGION needs. The mapping is not Go heap memory, so the
// address stays valid until munmap.
func hostAddress(b []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}
