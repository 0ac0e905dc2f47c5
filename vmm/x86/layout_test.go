package x86

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLayoutBootRegionsDisjoint checks that the boot data regions below
// 1 MiB do not overlap each other and stay below the EBDA.
func TestLayoutBootRegionsDisjoint(t *testing.T) {
	type region struct {
		name       string
		start, end uint64
	}
	regions := []region{
		{"GDT", BootGDTAddr, BootGDTAddr + uint64(8*len(BootGDT()))},
		{"IDT", BootIDTAddr, BootIDTAddr + 8},
		{"PVH start info", PVHStartInfoAddr, PVHStartInfoAddr + pvhStartInfoSize},
		{"PVH modlist", PVHModlistAddr, PVHModlistAddr + pvhModlistEntrySize},
		{"PVH memmap", PVHMemmapAddr, PVHMemmapAddr + uint64(PVHMaxMemmapEntries*pvhMemmapEntrySize)},
		{"zero page", ZeroPageAddr, ZeroPageAddr + ZeroPageSize},
		{"stack", ZeroPageAddr + ZeroPageSize, BootStackPointer + 0x10},
		{"page tables", PML4Addr, PML4Addr + uint64(len(IdentityPageTables()))},
		{"cmdline", CmdlineAddr, CmdlineAddr + CmdlineMaxSize},
		{"MP table (254 CPUs)", MPTableAddr, MPTableAddr + uint64(MPTableSize(MaxCPUs))},
	}
	for i, a := range regions {
		require.Less(t, a.start, a.end, a.name)
		if a.name != "MP table (254 CPUs)" {
			require.LessOrEqual(t, a.end, EBDAStart, "%s runs into the EBDA", a.name)
		}
		for _, b := range regions[i+1:] {
			require.False(t, a.start < b.end && b.start < a.end, "%s [%#x,%#x) overlaps %s [%#x,%#x)", a.name, a.start, a.end, b.name, b.start, b.end)
		}
	}
	require.LessOrEqual(t, MPTableAddr+uint64(MPTableSize(MaxCPUs)), HighMemStart)
	require.Equal(t, PML4Addr+0x1000, PDPTAddr)
	require.Equal(t, PDPTAddr+0x1000, PDAddr)
}

// TestLayoutHole checks that devices and KVM's private pages sit in the
// MMIO hole without overlapping.
func TestLayoutHole(t *testing.T) {
	virtioEnd := VirtioMMIOBase + VirtioMMIOMaxDevices*VirtioMMIOSize
	require.GreaterOrEqual(t, VirtioMMIOBase, MMIOHoleStart)
	require.LessOrEqual(t, virtioEnd, IOAPICAddr)
	require.Less(t, IOAPICAddr, LAPICAddr)
	require.GreaterOrEqual(t, KVMIdentityMapAddr, LAPICAddr+0x1000)
	require.Equal(t, KVMIdentityMapAddr+0x1000, KVMTSSAddr)
	require.LessOrEqual(t, KVMTSSAddr+3*0x1000, MMIOHoleEnd)
	require.GreaterOrEqual(t, IdentityMapSize, MMIOHoleEnd, "identity map must cover the hole")
	require.Less(t, KernelLoadAddr, MMIOHoleStart)
}
