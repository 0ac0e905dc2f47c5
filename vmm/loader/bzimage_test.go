package loader

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

func TestLoadBzImage(t *testing.T) {
	for _, sects := range []uint8{1, 0, 30} {
		spec := defaultBz()
		spec.setupSects = sects
		img := buildBzImage(spec)
		mem := newSparseMemory(testMem)
		k, err := LoadKernel(mem, testMem, img)
		require.NoError(t, err, "setup_sects %d", sects)
		setupSize := (int(sects) + 1) * 512
		if sects == 0 {
			setupSize = 5 * 512
		}
		require.Equal(t, FormatBzImage, k.Format)
		require.Equal(t, uint64(0x1000200), k.Entry64, "64-bit entry = load address + 0x200")
		require.Zero(t, k.PVHEntry)
		require.Equal(t, uint64(0x1000000), k.LoadAddr)
		require.Equal(t, uint64(0x1040000), k.LoadEnd, "init_size counts, not only the file")
		require.Equal(t, uint64(0x7fffffff), k.InitrdAddrMax)
		require.Equal(t, 2048, k.CmdlineMaxSize)
		require.Equal(t, img[0x1f1:0x26c], k.SetupHeader)
		require.Equal(t, img[setupSize:], mem.read(0x1000000, len(img)-setupSize))
		require.Equal(t, uint64(0x1000000), mem.lowest, "the real-mode part is not loaded")
		require.Equal(t, "bzImage", k.Format.String())
	}
}

func TestLoadBzImageKernelLargerThanInitSize(t *testing.T) {
	spec := defaultBz()
	spec.initSize = 0x1000
	k, err := LoadKernel(newSparseMemory(testMem), testMem, buildBzImage(spec))
	require.NoError(t, err)
	require.Equal(t, uint64(0x1003000), k.LoadEnd)
}

func TestLoadBzImageHugeCmdlineSizeCapped(t *testing.T) {
	spec := defaultBz()
	spec.cmdlineSize = 0xffffffff
	k, err := LoadKernel(newSparseMemory(testMem), testMem, buildBzImage(spec))
	require.NoError(t, err)
	require.Equal(t, int(x86.EBDAStart-x86.CmdlineAddr), k.CmdlineMaxSize)
}

func TestLoadBzImageRejects(t *testing.T) {
	le := binary.LittleEndian
	tests := map[string]func() []byte{
		"truncated header": func() []byte { return buildBzImage(defaultBz())[:0x240] },
		"protocol 2.11": func() []byte {
			s := defaultBz()
			s.version = 0x020b
			return buildBzImage(s)
		},
		"not 64-bit": func() []byte {
			s := defaultBz()
			s.xloadflags = 0
			return buildBzImage(s)
		},
		"zImage": func() []byte {
			s := defaultBz()
			s.loadflags = 0
			return buildBzImage(s)
		},
		"header too short": func() []byte {
			b := buildBzImage(defaultBz())
			b[0x201] = 0x20
			return b
		},
		"header too long": func() []byte {
			b := buildBzImage(defaultBz())
			b[0x201] = 0xff
			return b
		},
		"no protected-mode kernel": func() []byte {
			s := defaultBz()
			s.kernel = nil
			return buildBzImage(s)
		},
		"kernel shorter than its entry": func() []byte {
			s := defaultBz()
			s.kernel = pattern(0x200, 1)
			return buildBzImage(s)
		},
		"setup sectors past end": func() []byte {
			b := buildBzImage(defaultBz())
			b[0x1f1] = 200
			return b
		},
		"truncated kernel": func() []byte {
			b := buildBzImage(defaultBz())
			return b[:len(b)-0x100]
		},
		"unaligned pref_address": func() []byte {
			s := defaultBz()
			s.prefAddress = 0x1000010
			return buildBzImage(s)
		},
		"pref_address below 1 MiB": func() []byte {
			s := defaultBz()
			s.prefAddress = 0x10000
			return buildBzImage(s)
		},
		"pref_address overflow": func() []byte {
			s := defaultBz()
			s.prefAddress = ^uint64(0) &^ 0xfff
			return buildBzImage(s)
		},
		"init_size beyond memory": func() []byte {
			s := defaultBz()
			s.initSize = testMem
			return buildBzImage(s)
		},
		"kernel_alignment not a power of two": func() []byte {
			b := buildBzImage(defaultBz())
			le.PutUint32(b[x86.SHKernelAlignment:], 0x300000)
			return b
		},
	}
	for name, build := range tests {
		t.Run(name, func(t *testing.T) {
			mem := newSparseMemory(testMem)
			_, err := LoadKernel(mem, testMem, build())
			require.ErrorIs(t, err, ErrBadImage)
			require.Zero(t, mem.writes)
		})
	}
}
