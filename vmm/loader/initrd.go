package loader

import (
	"errors"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// ErrNoRoom is returned when the initrd does not fit.
var ErrNoRoom = errors.New("no room in guest memory")

// LoadInitrd copies initrd into guest memory of memBytes bytes, page-aligned
// at the highest address that keeps it below the MMIO hole, below memBytes
// and at or below maxAddr (the kernel's initrd_addr_max, Kernel.InitrdAddrMax;
// 0 means x86.DefaultInitrdAddrMax), and above kernelEnd (Kernel.LoadEnd) so
// it never overlaps the kernel. It returns the initrd's guest address.
// Linux moves the initrd if it needs the memory, so the top of low RAM
// keeps it out of the kernel's early allocations.
func LoadInitrd(mem x86.GuestWriter, initrd []byte, memBytes, kernelEnd, maxAddr uint64) (addr uint64, err error) {
	if len(initrd) == 0 {
		return 0, fmt.Errorf("%w: the initrd is empty", ErrNoRoom)
	}
	if err := x86.CheckMemorySize(memBytes); err != nil {
		return 0, err
	}
	if maxAddr == 0 {
		maxAddr = x86.DefaultInitrdAddrMax
	}
	top := lowRAMEnd(memBytes)
	if maxAddr < top {
		top = maxAddr + 1 // maxAddr is the last usable byte
	}
	size := uint64(len(initrd))
	floor := (max(kernelEnd, x86.HighMemStart) + x86.InitrdAlign - 1) &^ (x86.InitrdAlign - 1)
	if floor < kernelEnd || size > top || (top-size)&^(x86.InitrdAlign-1) < floor {
		return 0, fmt.Errorf("%w: initrd of %d bytes does not fit between the kernel's end %#x and %#x; give the guest more memory or use a smaller initrd", ErrNoRoom, size, kernelEnd, top)
	}
	addr = (top - size) &^ (x86.InitrdAlign - 1)
	if err := mem.WriteAt(initrd, addr); err != nil {
		return 0, fmt.Errorf("write initrd at %#x: %w", addr, err)
	}
	return addr, nil
}
