package x86

import (
	"encoding/binary"
	"fmt"
)

// GuestWriter writes guest physical memory. It must return an error (never
// panic) when [gpa, gpa+len(p)) is not wholly inside guest RAM. The VMM's
// guest memory implements it.
type GuestWriter interface {
	WriteAt(p []byte, gpa uint64) error
}

// GuestReader reads guest physical memory. It must return an error (never
// panic) when [gpa, gpa+len(p)) is not wholly inside guest RAM. The VMM's
// guest memory implements it.
type GuestReader interface {
	ReadAt(p []byte, gpa uint64) error
}

// Page-table entry bits.
const (
	pagePresent  uint64 = 1 << 0
	pageWritable uint64 = 1 << 1
	pageHuge     uint64 = 1 << 7 // PS: a 2 MiB page in a PD entry, 1 GiB in a PDPT entry
	// pageFrame is the physical address bits of an entry (bits 12 to 51).
	pageFrame uint64 = 0x000f_ffff_ffff_f000
)

// IdentityPageTables returns the boot page tables, one 4 KiB page each, to
// be written at PML4Addr, PDPTAddr and PDAddr+i*0x1000 (in that order,
// contiguous from PML4Addr): an identity map of the first IdentityMapSize
// bytes with 2 MiB pages.
//
// Why 4 GiB with 2 MiB pages: the 64-bit boot protocol only needs the
// kernel, the zero page and the command line mapped, and Linux's
// startup_64 builds its own tables at once; but the initrd may sit anywhere
// below the 3 GiB hole, and mapping the hole as well costs nothing (four
// PD pages, 16 KiB) and spares any early MMIO access a fault. 1 GiB pages
// would need the pdpe1gb CPUID feature, which not every host offers.
func IdentityPageTables() []byte {
	const page = 0x1000
	buf := make([]byte, (2+IdentityMapPDs)*page)
	binary.LittleEndian.PutUint64(buf[0:], PDPTAddr|pagePresent|pageWritable)
	for i := range IdentityMapPDs {
		pd := PDAddr + uint64(i)*page
		binary.LittleEndian.PutUint64(buf[page+i*8:], pd|pagePresent|pageWritable)
		for j := range 512 {
			addr := uint64(i)<<30 | uint64(j)<<21
			binary.LittleEndian.PutUint64(buf[(2+i)*page+j*8:], addr|pagePresent|pageWritable|pageHuge)
		}
	}
	return buf
}

// WriteIdentityPageTables writes IdentityPageTables at PML4Addr and returns
// the CR3 value for LongModeSystemRegisters (PML4Addr).
func WriteIdentityPageTables(mem GuestWriter) (cr3 uint64, err error) {
	if err := mem.WriteAt(IdentityPageTables(), PML4Addr); err != nil {
		return 0, fmt.Errorf("write identity page tables at %#x: %w", PML4Addr, err)
	}
	return PML4Addr, nil
}

// Paging is the vCPU state that says how its linear addresses translate:
// the control registers and EFER, as KVM reports them in kvm_sregs.
type Paging struct {
	CR0, CR3, CR4, EFER uint64
}

// Translate walks the guest's page tables in mem the way the MMU does and
// returns the guest physical address of linear, or false when it is not
// mapped (or a table cannot be read). It understands no paging and 4-level
// long-mode paging with 4 KiB, 2 MiB and 1 GiB pages, which covers the boot
// paths this VMM starts guests in (IdentityPageTables, and Linux's own
// tables later); 32-bit paging and PAE without long mode are refused.
// Access rights (writable, user, NX) are not checked.
func (p Paging) Translate(mem GuestReader, linear uint64) (gpa uint64, ok bool) {
	if p.CR0&CR0Paging == 0 {
		return linear, true
	}
	if p.CR4&CR4PAE == 0 || p.EFER&EFERLongModeActive == 0 {
		return 0, false
	}
	table := p.CR3 & pageFrame
	var buf [8]byte
	for level := 3; level >= 0; level-- { // PML4, PDPT, PD, PT
		shift := uint(12 + 9*level)
		index := (linear >> shift) & 0x1ff
		if err := mem.ReadAt(buf[:], table+index*8); err != nil {
			return 0, false
		}
		entry := binary.LittleEndian.Uint64(buf[:])
		if entry&pagePresent == 0 {
			return 0, false
		}
		if level == 0 || (level <= 2 && entry&pageHuge != 0) { // a page, not a table
			pageMask := uint64(1)<<shift - 1
			return (entry & pageFrame &^ pageMask) | (linear & pageMask), true
		}
		table = entry & pageFrame
	}
	return 0, false
}
