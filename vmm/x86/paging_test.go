package x86

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteIdentityPageTables(t *testing.T) {
	mem := newFakeMemory(0x100000)
	for i := range mem.b { // garbage that must not leak into the tables
		mem.b[i] = 0xff
	}
	cr3, err := WriteIdentityPageTables(mem)
	require.NoError(t, err)
	require.Equal(t, PML4Addr, cr3)
	paging := Paging{CR0: LongModeCR0, CR3: cr3, CR4: LongModeCR4, EFER: LongModeEFER}
	for _, va := range []uint64{0, 0x7000, 0x1fffff, 0x200000, KernelLoadAddr + 0x1234,
		MMIOHoleStart - 1, VirtioMMIOBase, IOAPICAddr, LAPICAddr + 0x30, IdentityMapSize - 1} {
		pa, ok := paging.Translate(mem, va)
		require.True(t, ok, "%#x unmapped", va)
		require.Equal(t, va, pa)
	}
	for _, va := range []uint64{IdentityMapSize, IdentityMapSize + 0x200000, 1 << 39} {
		_, ok := paging.Translate(mem, va)
		require.False(t, ok, "%#x mapped beyond the identity map", va)
	}
	// Every mapping is a writable 2 MiB page (the walk above does not
	// check access rights or page sizes).
	le := binary.LittleEndian
	for i := range IdentityMapPDs {
		require.Equal(t, PDAddr+uint64(i)*0x1000|pagePresent|pageWritable, le.Uint64(mem.b[PDPTAddr+uint64(i)*8:]), "PDPT[%d]", i)
		for j := range uint64(512) {
			pde := le.Uint64(mem.b[PDAddr+uint64(i)*0x1000+j*8:])
			require.Equal(t, pagePresent|pageWritable|pageHuge, pde&^pageFrame, "PD[%d][%d] flags", i, j)
		}
	}
	_, err = WriteIdentityPageTables(newFakeMemory(0xc000))
	require.Error(t, err, "tables that do not fit must fail, not be truncated")
}

func TestTranslateWalksLongModeTables(t *testing.T) {
	mem := newFakeMemory(1 << 22)
	put := func(gpa, v uint64) {
		binary.LittleEndian.PutUint64(mem.b[gpa:], v)
	}
	// PML4 at 0x1000; entry 511 -> PDPT 0x2000; PDPT[510] -> PD 0x3000;
	// PD[0] -> 2 MiB page at 0x200000; PD[1] -> PT 0x4000; PT[3] -> 0x5000;
	// PDPT[0] -> 1 GiB page at 0 (PML4[256] -> PDPT 0x6000 -> PDPT[0]);
	// PD[2] -> a table outside memory.
	put(0x1000+511*8, 0x2000|3)
	put(0x2000+510*8, 0x3000|3)
	put(0x3000, 0x200000|0x83)
	put(0x3000+8, 0x4000|3)
	put(0x4000+3*8, 0x5000|3)
	put(0x1000+256*8, 0x6000|3)
	put(0x6000, 0x0|0x83)
	put(0x3000+2*8, 0x40_0000_0000|3)
	long := Paging{CR0: CR0Paging | CR0ProtectionEnable, CR4: CR4PAE, EFER: EFERLongModeActive | EFERLongModeEnable, CR3: 0x1000}
	for _, c := range []struct {
		linear, want uint64
		ok           bool
	}{
		{0xffffffff80000123, 0x200123, true}, // 2 MiB page
		{0xffffffff80203456, 0x5456, true},   // 4 KiB page
		{0xffff800000345678, 0x345678, true}, // 1 GiB page
		{0xffffffff80204000, 0, false},       // PT[4] not present
		{0x1000, 0, false},                   // PML4[0] not present
		{0xffffffff80400000, 0, false},       // PD[2]'s table is not in memory
	} {
		got, ok := long.Translate(mem, c.linear)
		require.Equal(t, c.ok, ok, "Translate(%#x)", c.linear)
		require.Equal(t, c.want, got, "Translate(%#x)", c.linear)
	}

	got, ok := Paging{}.Translate(mem, 0x1234)
	require.True(t, ok, "no paging: linear is physical")
	require.Equal(t, uint64(0x1234), got)
	_, ok = Paging{CR0: CR0Paging, CR3: 0x1000}.Translate(mem, 0x1234)
	require.False(t, ok, "32-bit paging is not understood")
	_, ok = Paging{CR0: CR0Paging, CR4: CR4PAE, CR3: 0x1000}.Translate(mem, 0x1234)
	require.False(t, ok, "PAE without long mode is not understood")
	_, ok = long.Translate(failingMemory{}, 0xffffffff80000123)
	require.False(t, ok, "an unreadable table is not a mapping")
}
