package vmm

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// How guest RAM is mapped. Each page the guest touches first costs a
// nested-paging fault (an exit to KVM); in a nested VM each of those is
// dearer still. Backed by 2 MiB transparent huge pages, one fault maps 512
// pages: so guest RAM is anonymous memory aligned to a huge page and
// advised to use them (MADV_HUGEPAGE, honoured where the host's THP mode
// is "always" or "madvise", the common defaults). In the nested harness
// that took a cold boot's kernel entry → /init from 2.68 s to 1.58 s
// (medians of 3), for 4.4 MiB more guest RAM touched.
//
// A snapshot's RAM stays mapped copy-on-write from its file, each page
// read when the guest first touches it (in 4 KiB pages: private file
// mappings get no huge pages). Copying the image's data into huge-page
// anonymous memory instead was measured in the same harness: the copy
// cost ~700 ms up front (start → /init 196 ms → 888 ms) and the restored
// guest's spawns gained nothing measurable, so it was not kept.

// hugePageSize is x86's transparent huge page (a PMD's reach).
const hugePageSize = 2 << 20

// mapAnonymousRAM maps size bytes of anonymous memory (MAP_NORESERVE,
// demand-paged) aligned to a huge page, and advises huge pages for it. Its
// alignment lets KVM map it 2 MiB at a time (the guest-physical addresses
// of regions are 2 MiB aligned too).
func mapAnonymousRAM(size uint64) ([]byte, error) {
	reserve := uintptr(size) + hugePageSize
	p, err := unix.MmapPtr(-1, 0, nil, reserve, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	start := uintptr(p)
	aligned := (start + hugePageSize - 1) &^ (hugePageSize - 1)
	if head := aligned - start; head > 0 {
		_ = unix.MunmapPtr(p, head)
	}
	if tail := start + reserve - (aligned + uintptr(size)); tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(p, aligned-start+uintptr(size)), tail)
	}
	host := unsafe.Slice((*byte)(unsafe.Add(p, aligned-start)), size)
	// EINVAL: a kernel without THP; the memory works all the same.
	_ = unix.Madvise(host, unix.MADV_HUGEPAGE)
	return host, nil
}

// mapImageRAM maps size bytes of the memory image at offset of fd
// copy-on-write (MAP_PRIVATE).
func mapImageRAM(fd int, offset int64, size uint64) ([]byte, error) {
	p, err := unix.MmapPtr(fd, offset, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// unmapRAM unmaps what mapAnonymousRAM or mapImageRAM mapped.
func unmapRAM(host []byte) error {
	if len(host) == 0 {
		return nil
	}
	return unix.MunmapPtr(unsafe.Pointer(&host[0]), uintptr(len(host)))
}
