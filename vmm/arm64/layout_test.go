package arm64

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLayoutDevicesDisjoint checks the device windows, in address order,
// neither overlap nor reach RAM, and the redistributors of MaxCPUs vCPUs
// end exactly at the distributor.
func TestLayoutDevicesDisjoint(t *testing.T) {
	type region struct {
		name       string
		start, end uint64
	}
	regions := []region{
		{"UART", UARTBase, UARTBase + UARTSize},
		{"boot timer", BootTimerBase, BootTimerBase + PlatformPageSize},
		{"snapshot point", SnapshotPointBase, SnapshotPointBase + PlatformPageSize},
		{"virtio-mmio", VirtioMMIOBase, VirtioMMIOBase + VirtioMMIOMaxDevices*VirtioMMIOSize},
		{"GIC redistributors", GICRedistributorBase, GICRedistributorBase + GICRedistributorSize(MaxCPUs)},
		{"GIC distributor", GICDistributorBase, GICDistributorBase + GICDistributorSize},
		{"RAM", RAMBase, RAMBase + MaxRAM},
	}
	for i := 1; i < len(regions); i++ {
		a, b := regions[i-1], regions[i]
		require.Less(t, a.start, a.end, a.name)
		require.LessOrEqual(t, a.end, b.start, "%s [%#x,%#x) runs into %s at %#x", a.name, a.start, a.end, b.name, b.start)
	}
	require.Equal(t, GICDistributorBase, GICRedistributorBase+GICRedistributorSize(MaxCPUs))
	require.Equal(t, uint64(0x3F7F_0000), GICRedistributorBase)
	require.Equal(t, uint64(1)<<DefaultIPABits, RAMBase+MaxRAM)
	require.Zero(t, RAMBase%(1<<30), "RAM base must be 1 GiB-aligned for the initrd window")
	require.Zero(t, RAMBase%KernelBaseAlign)
	require.Zero(t, GICRedistributorBase%0x1_0000, "redistributors are 64 KiB-aligned")
}

// TestLayoutInterrupts checks the SPIs of the UART and every virtio device
// are distinct and inside the vGIC's GICIRQs, and the timer INTIDs of the
// shared decisions.
func TestLayoutInterrupts(t *testing.T) {
	used := map[uint32]string{UARTSPI: "UART"}
	for i := range VirtioMMIOMaxDevices {
		d := VirtioDevice(i)
		require.NotContains(t, used, d.SPI)
		used[d.SPI] = "virtio"
		require.Less(t, int(d.SPI)+SPIBase, GICIRQs)
	}
	require.Zero(t, GICIRQs%32, "KVM wants a multiple of 32")
	require.Equal(t, []int{29, 30, 27, 26}, []int{PPIBase + TimerSecurePPI, PPIBase + TimerNonSecurePPI, PPIBase + TimerVirtualPPI, PPIBase + TimerHypPPI})
	require.Equal(t, 27, TimerVirtualINTID)
	require.Equal(t, 30, TimerNonSecureINTID)
	require.Equal(t, MMIODevice{Base: 0x0A00_0000, SPI: 16}, VirtioDevice(0))
	require.Equal(t, MMIODevice{Base: 0x0A01_F000, SPI: 47}, VirtioDevice(31))
}

func TestCheckMemorySize(t *testing.T) {
	for _, ok := range []uint64{MinRAM, 512 << 20, 513 << 20, MinRAM + RAMAlign, MaxRAM} {
		require.NoError(t, CheckMemorySize(ok), "%#x", ok)
	}
	for _, bad := range []uint64{0, 0x1000, MinRAM - RAMAlign, 512<<20 + 0x1000, MaxRAM + RAMAlign, 1 << 63} {
		require.ErrorIs(t, CheckMemorySize(bad), ErrBadMemorySize, "%#x", bad)
	}
}

func TestMemoryRegions(t *testing.T) {
	r, err := MemoryRegions(1 << 30)
	require.NoError(t, err)
	require.Equal(t, []MemoryRegion{{GPA: 0x8000_0000, Size: 1 << 30}}, r)
	require.Equal(t, uint64(0xC000_0000), r[0].End())
	_, err = MemoryRegions(123)
	require.ErrorIs(t, err, ErrBadMemorySize)
}

// TestMPIDR checks KVM's vCPU affinity: 16 vCPUs per Aff0 cluster.
func TestMPIDR(t *testing.T) {
	for index, want := range map[int]uint64{0: 0, 1: 1, 15: 0xf, 16: 0x100, 17: 0x101, 63: 0x30f, 4096: 0x1_0000} {
		require.Equal(t, want, MPIDR(index), "vCPU %d", index)
	}
}
