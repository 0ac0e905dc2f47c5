package x86

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGDTEntryKnownValues(t *testing.T) {
	// Values as Linux's GDT_ENTRY and Firecracker's gdt_entry produce them.
	require.Equal(t, uint64(0x00af9b000000ffff), GDTEntry(0xa09b, 0, 0xfffff))
	require.Equal(t, uint64(0x00cf93000000ffff), GDTEntry(0xc093, 0, 0xfffff))
	require.Equal(t, uint64(0x00cf9b000000ffff), GDTEntry(0xc09b, 0, 0xfffff))
	require.Equal(t, uint64(0x12408b3456780067), GDTEntry(0x408b, 0x12345678, 0x67))
}

func TestSegmentFromGDT(t *testing.T) {
	gdt := BootGDT()
	code64 := SegmentFromGDT(gdt[2], 2)
	require.Equal(t, Segment{Base: 0, Limit: 0xffffffff, Selector: SelectorCode64, Type: 0xb,
		Present: 1, S: 1, L: 1, G: 1}, code64)
	code32 := SegmentFromGDT(gdt[1], 1)
	require.Equal(t, Segment{Limit: 0xffffffff, Selector: SelectorCode32, Type: 0xb,
		Present: 1, S: 1, DB: 1, G: 1}, code32)
	data := SegmentFromGDT(gdt[3], 3)
	require.Equal(t, Segment{Limit: 0xffffffff, Selector: SelectorData, Type: 0x3,
		Present: 1, S: 1, DB: 1, G: 1}, data)
	tss := SegmentFromGDT(gdt[4], 4)
	require.Equal(t, Segment{Limit: 0x67, Selector: SelectorTSS, Type: 0xb, Present: 1}, tss)

	// Base and DPL/AVL decode from every bit position.
	s := SegmentFromGDT(GDTEntry(0x10f3, 0xdeadbeef, 0x12345), 7)
	require.Equal(t, uint64(0xdeadbeef), s.Base)
	require.Equal(t, uint32(0x12345), s.Limit)
	require.Equal(t, uint8(3), s.DPL)
	require.Equal(t, uint8(1), s.AVL)
	require.Equal(t, uint16(0x38), s.Selector)
}

func TestWriteBootGDT(t *testing.T) {
	mem := newFakeMemory(0x10000)
	copy(mem.b[BootIDTAddr:], []byte{1, 2, 3, 4, 5, 6, 7, 8}) // stale data must be cleared
	require.NoError(t, WriteBootGDT(mem))
	for i, e := range BootGDT() {
		require.Equal(t, e, binary.LittleEndian.Uint64(mem.b[BootGDTAddr+uint64(8*i):]), "entry %d", i)
	}
	require.Equal(t, make([]byte, 8), mem.b[BootIDTAddr:BootIDTAddr+8])
	require.Error(t, WriteBootGDT(failingMemory{}))
}

func TestLongModeSystemRegisters(t *testing.T) {
	s := LongModeSystemRegisters(PML4Addr)
	require.Equal(t, SelectorCode64, s.CS.Selector, "64-bit boot protocol wants CS = __BOOT_CS")
	require.Equal(t, uint8(1), s.CS.L)
	for _, seg := range []Segment{s.DS, s.ES, s.SS, s.FS, s.GS} {
		require.Equal(t, SelectorData, seg.Selector, "64-bit boot protocol wants __BOOT_DS")
		require.Equal(t, uint32(0xffffffff), seg.Limit)
	}
	require.Equal(t, SelectorTSS, s.TR.Selector)
	require.Equal(t, uint64(0x80000011), s.CR0)
	require.Equal(t, PML4Addr, s.CR3)
	require.Equal(t, uint64(0x20), s.CR4)
	require.Equal(t, uint64(0x500), s.EFER)
	require.Equal(t, DescriptorTable{Base: BootGDTAddr, Limit: 47}, s.GDT)
	require.Equal(t, DescriptorTable{Base: BootIDTAddr, Limit: 7}, s.IDT)

	r := LinuxBootRegisters(0x1000000)
	require.Equal(t, Registers{RIP: 0x1000000, RSI: ZeroPageAddr, RSP: BootStackPointer,
		RBP: BootStackPointer, RFLAGS: 2}, r)
}

func TestPVHSystemRegisters(t *testing.T) {
	s := PVHSystemRegisters()
	require.Equal(t, SelectorCode32, s.CS.Selector)
	require.Equal(t, uint8(0), s.CS.L)
	require.Equal(t, uint8(1), s.CS.DB)
	require.Equal(t, uint32(0xffffffff), s.CS.Limit)
	require.Equal(t, SelectorData, s.SS.Selector)
	require.Equal(t, uint32(0x67), s.TR.Limit, "PVH wants a TSS with limit 0x67")
	require.Equal(t, uint64(0x11), s.CR0, "PE without PG")
	require.Zero(t, s.CR4)
	require.Zero(t, s.EFER)
	r := PVHBootRegisters(0x1234)
	require.Equal(t, uint64(0x1234), r.RIP)
	require.Equal(t, PVHStartInfoAddr, r.RBX)
	require.Equal(t, uint64(2), r.RFLAGS)
}
