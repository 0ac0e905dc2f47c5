package x86

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// translate walks 4-level page tables in mem the way the MMU does, for
// 2 MiB pages, and reports the physical address or false if unmapped.
func translate(mem []byte, cr3, va uint64) (uint64, bool) {
	le := binary.LittleEndian
	entry := func(table, index uint64) uint64 { return le.Uint64(mem[table+index*8:]) }
	const addrMask = 0x000ffffffffff000
	pml4e := entry(cr3&addrMask, (va>>39)&511)
	if pml4e&pagePresent == 0 {
		return 0, false
	}
	pdpte := entry(pml4e&addrMask, (va>>30)&511)
	if pdpte&pagePresent == 0 || pdpte&pageHuge != 0 {
		return 0, false
	}
	pde := entry(pdpte&addrMask, (va>>21)&511)
	if pde&pagePresent == 0 || pde&pageHuge == 0 || pde&pageWritable == 0 {
		return 0, false
	}
	return pde&0x000fffffffe00000 | va&0x1fffff, true
}

func TestWriteIdentityPageTables(t *testing.T) {
	mem := newFakeMemory(0x100000)
	for i := range mem.b { // garbage that must not leak into the tables
		mem.b[i] = 0xff
	}
	cr3, err := WriteIdentityPageTables(mem)
	require.NoError(t, err)
	require.Equal(t, PML4Addr, cr3)
	for _, va := range []uint64{0, 0x7000, 0x1fffff, 0x200000, KernelLoadAddr + 0x1234,
		MMIOHoleStart - 1, VirtioMMIOBase, IOAPICAddr, LAPICAddr + 0x30, IdentityMapSize - 1} {
		pa, ok := translate(mem.b, cr3, va)
		require.True(t, ok, "%#x unmapped", va)
		require.Equal(t, va, pa)
	}
	for _, va := range []uint64{IdentityMapSize, IdentityMapSize + 0x200000, 1 << 39} {
		_, ok := translate(mem.b, cr3, va)
		require.False(t, ok, "%#x mapped beyond the identity map", va)
	}
	_, err = WriteIdentityPageTables(newFakeMemory(0xc000))
	require.Error(t, err, "tables that do not fit must fail, not be truncated")
}
