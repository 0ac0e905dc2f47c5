package x86

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBuildBootParamsVmlinux(t *testing.T) {
	e820, err := E820Map(8 << 30)
	require.NoError(t, err)
	zp, err := BuildBootParams(BootParamsConfig{
		CmdlineAddr: CmdlineAddr, CmdlineSize: 42,
		InitrdAddr: 0x1_2345_6000, InitrdSize: 0x1_0000_1000,
		E820: e820,
	})
	require.NoError(t, err)
	require.Len(t, zp, ZeroPageSize)
	le := binary.LittleEndian
	require.Equal(t, uint16(0xaa55), le.Uint16(zp[0x1fe:]))
	require.Equal(t, "HdrS", string(zp[0x202:0x206]))
	require.Equal(t, uint16(0x020f), le.Uint16(zp[0x206:]))
	require.Equal(t, uint8(0xff), zp[0x210], "type_of_loader")
	require.Equal(t, uint8(0x81), zp[0x211], "LOADED_HIGH|CAN_USE_HEAP")
	require.Equal(t, uint16(0xfe00), le.Uint16(zp[0x224:]))
	require.Equal(t, uint32(CmdlineAddr), le.Uint32(zp[0x228:]))
	require.Zero(t, le.Uint32(zp[0x0c8:]))
	require.Equal(t, uint32(42), le.Uint32(zp[0x238:]))
	require.Equal(t, uint32(0x1000000), le.Uint32(zp[0x230:]), "kernel_alignment")
	// 64-bit initrd address and size split into low and ext_ halves.
	require.Equal(t, uint32(0x2345_6000), le.Uint32(zp[0x218:]))
	require.Equal(t, uint32(1), le.Uint32(zp[0x0c0:]))
	require.Equal(t, uint32(0x1000), le.Uint32(zp[0x21c:]))
	require.Equal(t, uint32(1), le.Uint32(zp[0x0c4:]))
	require.Zero(t, zp[0x1ef], "sentinel")
	require.Equal(t, uint8(len(e820)), zp[0x1e8])
	for i, e := range e820 {
		off := 0x2d0 + 20*i
		require.Equal(t, e.Addr, le.Uint64(zp[off:]))
		require.Equal(t, e.Size, le.Uint64(zp[off+8:]))
		require.Equal(t, uint32(e.Type), le.Uint32(zp[off+16:]))
	}
}

func TestBuildBootParamsBzImageHeader(t *testing.T) {
	// A setup header as a bzImage carries it, with fields the loader
	// must keep (version, xloadflags, init_size, cmdline_size) and ones
	// it must overwrite (loader type, pointers).
	hdr := make([]byte, 0x26c-0x1f1)
	le := binary.LittleEndian
	put16 := func(off int, v uint16) { le.PutUint16(hdr[off-0x1f1:], v) }
	put32 := func(off int, v uint32) { le.PutUint32(hdr[off-0x1f1:], v) }
	hdr[0] = 27 // setup_sects
	put16(0x1fe, 0xaa55)
	put32(0x202, HeaderMagic)
	put16(0x206, 0x020f)
	hdr[0x210-0x1f1] = 0x00
	hdr[0x211-0x1f1] = 0x01 | 0x20 // LOADED_HIGH | QUIET kept
	put32(0x228, 0xdeadbeef)
	put16(0x236, 0x7f)
	put32(0x238, 2047)
	put32(0x260, 0x2000000)
	zp, err := BuildBootParams(BootParamsConfig{SetupHeader: hdr, CmdlineAddr: CmdlineAddr, CmdlineSize: 5})
	require.NoError(t, err)
	require.Equal(t, uint8(27), zp[0x1f1])
	require.Equal(t, uint16(0x7f), le.Uint16(zp[0x236:]))
	require.Equal(t, uint32(2047), le.Uint32(zp[0x238:]), "kernel's cmdline_size is read-only")
	require.Equal(t, uint32(0x2000000), le.Uint32(zp[0x260:]))
	require.Equal(t, uint8(0xff), zp[0x210])
	require.Equal(t, uint8(0x81|0x20), zp[0x211])
	require.Equal(t, uint32(CmdlineAddr), le.Uint32(zp[0x228:]))
	require.Zero(t, le.Uint32(zp[0x218:]), "no initrd")
	require.Zero(t, zp[0x1e8])
}

func TestBuildBootParamsRejects(t *testing.T) {
	_, err := BuildBootParams(BootParamsConfig{CmdlineAddr: CmdlineAddr, SetupHeader: make([]byte, SetupHeaderMaxSize+1)})
	require.ErrorIs(t, err, ErrBadBootParams)
	_, err = BuildBootParams(BootParamsConfig{CmdlineAddr: CmdlineAddr, E820: make([]E820Entry, E820MaxEntries+1)})
	require.ErrorIs(t, err, ErrBadBootParams)
	_, err = BuildBootParams(BootParamsConfig{})
	require.ErrorIs(t, err, ErrBadBootParams)
	zp, err := BuildBootParams(BootParamsConfig{CmdlineAddr: CmdlineAddr, E820: make([]E820Entry, E820MaxEntries)})
	require.NoError(t, err)
	require.Equal(t, uint8(E820MaxEntries), zp[0x1e8])
}
