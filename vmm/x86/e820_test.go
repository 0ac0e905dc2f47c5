package x86

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestE820Map(t *testing.T) {
	const mib, gib = 1 << 20, 1 << 30
	lowRAM := []E820Entry{
		{Addr: 0, Size: 0x9fc00, Type: E820RAM},
		{Addr: 0x9fc00, Size: 0x60400, Type: E820Reserved},
	}
	tests := []struct {
		mem  uint64
		want []E820Entry
	}{
		{2 * mib, append(lowRAM[:2:2], E820Entry{Addr: mib, Size: mib, Type: E820RAM})},
		{256 * mib, append(lowRAM[:2:2], E820Entry{Addr: mib, Size: 255 * mib, Type: E820RAM})},
		{3 * gib, append(lowRAM[:2:2], E820Entry{Addr: mib, Size: 3*gib - mib, Type: E820RAM})},
		{3*gib + 4096, append(lowRAM[:2:2],
			E820Entry{Addr: mib, Size: 3*gib - mib, Type: E820RAM},
			E820Entry{Addr: 4 * gib, Size: 4096, Type: E820RAM})},
		{8 * gib, append(lowRAM[:2:2],
			E820Entry{Addr: mib, Size: 3*gib - mib, Type: E820RAM},
			E820Entry{Addr: 4 * gib, Size: 5 * gib, Type: E820RAM})},
	}
	for _, tc := range tests {
		got, err := E820Map(tc.mem)
		require.NoError(t, err, "mem %#x", tc.mem)
		require.Equal(t, tc.want, got, "mem %#x", tc.mem)

		// RAM + reserved covers exactly the backed memory.
		var total uint64
		for _, e := range got {
			total += e.Size
		}
		require.Equal(t, tc.mem, total)
		regions, err := MemoryRegions(tc.mem)
		require.NoError(t, err)
		var backed uint64
		for _, r := range regions {
			backed += r.Size
			require.False(t, r.GPA < MMIOHoleEnd && r.GPA+r.Size > MMIOHoleStart, "region %+v in the hole", r)
		}
		require.Equal(t, tc.mem, backed)
	}
}

func TestE820MapRejects(t *testing.T) {
	for _, mem := range []uint64{0, 4096, HighMemStart, HighMemStart + 1, 2<<20 + 100, MaxGuestMemory + 4096} {
		_, err := E820Map(mem)
		require.ErrorIs(t, err, ErrBadMemorySize, "mem %#x", mem)
		_, err = MemoryRegions(mem)
		require.ErrorIs(t, err, ErrBadMemorySize, "mem %#x", mem)
	}
}
