package x86

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWritePVHStartInfo(t *testing.T) {
	e820, err := E820Map(256 << 20)
	require.NoError(t, err)
	mem := newFakeMemory(0x10000)
	require.NoError(t, WritePVHStartInfo(mem, PVHConfig{CmdlineAddr: CmdlineAddr, InitrdAddr: 0x8000000, InitrdSize: 0x1234, E820: e820}))
	le := binary.LittleEndian
	si := mem.b[PVHStartInfoAddr:]
	require.Equal(t, uint32(0x336ec578), le.Uint32(si[0:]))
	require.Equal(t, uint32(1), le.Uint32(si[4:]), "version 1 has the memory map")
	require.Equal(t, uint32(1), le.Uint32(si[12:]), "one module")
	require.Equal(t, PVHModlistAddr, le.Uint64(si[16:]))
	require.Equal(t, CmdlineAddr, le.Uint64(si[24:]))
	require.Zero(t, le.Uint64(si[32:]), "no RSDP")
	require.Equal(t, PVHMemmapAddr, le.Uint64(si[40:]))
	require.Equal(t, uint32(len(e820)), le.Uint32(si[48:]))
	mod := mem.b[PVHModlistAddr:]
	require.Equal(t, uint64(0x8000000), le.Uint64(mod[0:]))
	require.Equal(t, uint64(0x1234), le.Uint64(mod[8:]))
	for i, e := range e820 {
		m := mem.b[PVHMemmapAddr+uint64(24*i):]
		require.Equal(t, e.Addr, le.Uint64(m[0:]))
		require.Equal(t, e.Size, le.Uint64(m[8:]))
		require.Equal(t, uint32(e.Type), le.Uint32(m[16:]))
	}
}

func TestPVHStartInfoNoInitrd(t *testing.T) {
	e820, err := E820Map(64 << 20)
	require.NoError(t, err)
	si, mods, _, err := PVHStartInfo(PVHConfig{CmdlineAddr: CmdlineAddr, E820: e820})
	require.NoError(t, err)
	require.Empty(t, mods)
	require.Zero(t, binary.LittleEndian.Uint32(si[12:]))
	require.Zero(t, binary.LittleEndian.Uint64(si[16:]))
}

func TestPVHStartInfoRejects(t *testing.T) {
	_, _, _, err := PVHStartInfo(PVHConfig{})
	require.ErrorIs(t, err, ErrBadPVHConfig)
	_, _, _, err = PVHStartInfo(PVHConfig{E820: make([]E820Entry, PVHMaxMemmapEntries+1)})
	require.ErrorIs(t, err, ErrBadPVHConfig)
	e820, _ := E820Map(64 << 20)
	require.Error(t, WritePVHStartInfo(failingMemory{}, PVHConfig{E820: e820}))
}
