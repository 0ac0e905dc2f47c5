package loader

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

func TestPrepareBoot64(t *testing.T) {
	for name, image := range map[string][]byte{"vmlinux": validELF(), "bzImage": buildBzImage(defaultBz())} {
		t.Run(name, func(t *testing.T) {
			mem := newSparseMemory(testMem)
			initrd := pattern(0x2800, 6)
			setup, err := PrepareBoot(mem, BootConfig{
				MemBytes: testMem, CPUs: 2, Kernel: image, Initrd: initrd, Cmdline: "console=ttyS0",
			})
			require.NoError(t, err)
			le := binary.LittleEndian
			zp := mem.read(x86.ZeroPageAddr, x86.ZeroPageSize)
			require.Equal(t, uint32(x86.CmdlineAddr), le.Uint32(zp[x86.SHCmdLinePtr:]))
			require.Equal(t, uint32(setup.InitrdAddr), le.Uint32(zp[x86.SHRamdiskImage:]))
			require.Equal(t, uint32(len(initrd)), le.Uint32(zp[x86.SHRamdiskSize:]))
			require.Equal(t, uint8(3), zp[x86.BPE820Entries])
			require.Equal(t, "HdrS", string(zp[x86.SHHeader:x86.SHHeader+4]))
			require.Equal(t, initrd, mem.read(setup.InitrdAddr, len(initrd)))
			require.Equal(t, []byte("console=ttyS0\x00"), mem.read(x86.CmdlineAddr, 14))
			require.Equal(t, "_MP_", string(mem.read(x86.MPTableAddr, 4)))
			require.Equal(t, x86.PDPTAddr|3, le.Uint64(mem.read(x86.PML4Addr, 8)))
			require.Equal(t, x86.BootGDT()[2], le.Uint64(mem.read(x86.BootGDTAddr+16, 8)))
			require.Equal(t, x86.LinuxBootRegisters(setup.Kernel.Entry64), setup.Regs)
			require.Equal(t, x86.LongModeSystemRegisters(x86.PML4Addr), setup.SRegs)
			require.GreaterOrEqual(t, setup.InitrdAddr, setup.Kernel.LoadEnd)
			if name == "bzImage" {
				require.Equal(t, uint16(0x020f), le.Uint16(zp[x86.SHVersion:]), "the image's own header")
				require.Equal(t, uint32(0x40000), le.Uint32(zp[x86.SHInitSize:]))
			}
		})
	}
}

func TestPrepareBootPVH(t *testing.T) {
	mem := newSparseMemory(testMem)
	setup, err := PrepareBoot(mem, BootConfig{MemBytes: testMem, CPUs: 1, Kernel: validELF(), Cmdline: "x", PVH: true})
	require.NoError(t, err)
	require.Equal(t, x86.PVHBootRegisters(0x1000040), setup.Regs)
	require.Equal(t, x86.PVHSystemRegisters(), setup.SRegs)
	require.Equal(t, x86.PVHStartMagic, binary.LittleEndian.Uint32(mem.read(x86.PVHStartInfoAddr, 4)))
	require.Zero(t, setup.InitrdAddr)
}

func TestPrepareBootRejects(t *testing.T) {
	noPVH := buildELF(elfSpec{entry: 0x1000000, segments: []elfSegment{{paddr: 0x1000000, memsz: 0x1000, data: pattern(16, 1)}}})
	tests := map[string]struct {
		cfg  BootConfig
		want error
	}{
		"no CPUs":          {BootConfig{MemBytes: testMem, Kernel: validELF()}, ErrBadBootConfig},
		"too many CPUs":    {BootConfig{MemBytes: testMem, CPUs: 255, Kernel: validELF()}, ErrBadBootConfig},
		"bad memory":       {BootConfig{MemBytes: 1 << 20, CPUs: 1, Kernel: validELF()}, x86.ErrBadMemorySize},
		"bad kernel":       {BootConfig{MemBytes: testMem, CPUs: 1, Kernel: []byte("nope")}, ErrBadImage},
		"PVH without note": {BootConfig{MemBytes: testMem, CPUs: 1, Kernel: noPVH, PVH: true}, ErrBadBootConfig},
		"PVH on bzImage":   {BootConfig{MemBytes: testMem, CPUs: 1, Kernel: buildBzImage(defaultBz()), PVH: true}, ErrBadBootConfig},
		"cmdline NUL":      {BootConfig{MemBytes: testMem, CPUs: 1, Kernel: validELF(), Cmdline: "\x00"}, ErrBadCmdline},
		"initrd too big":   {BootConfig{MemBytes: 32 << 20, CPUs: 1, Kernel: validELF(), Initrd: make([]byte, 31<<20)}, ErrNoRoom},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := PrepareBoot(newSparseMemory(testMem), tc.cfg)
			require.ErrorIs(t, err, tc.want)
		})
	}
}
