package loader

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

const testMem = 256 << 20

func TestLoadELF(t *testing.T) {
	mem := newSparseMemory(testMem)
	// Garbage where the bss goes must be cleared.
	require.NoError(t, mem.WriteAt(pattern(0x4000, 9), 0x1201000))
	img := validELF()
	k, err := LoadKernel(mem, testMem, img)
	require.NoError(t, err)
	require.Equal(t, Kernel{
		Format:         FormatELF,
		Entry64:        0x1000000,
		PVHEntry:       0x1000040,
		LoadAddr:       0x1000000,
		LoadEnd:        0x1205000,
		InitrdAddrMax:  x86.DefaultInitrdAddrMax,
		CmdlineMaxSize: x86.CmdlineMaxSize,
	}, k)
	require.Equal(t, pattern(0x2345, 1), mem.read(0x1000000, 0x2345))
	require.Equal(t, make([]byte, 0x3000-0x2345), mem.read(0x1002345, 0x3000-0x2345), "bss zeroed")
	require.Equal(t, pattern(0x1000, 2), mem.read(0x1200000, 0x1000))
	require.Equal(t, make([]byte, 0x4000), mem.read(0x1201000, 0x4000), "bss zeroed over garbage")
	require.Equal(t, "ELF vmlinux", k.Format.String())
}

func TestLoadELFPVHNote4Bytes(t *testing.T) {
	img := buildELF(elfSpec{entry: 0x1000000, segments: []elfSegment{{paddr: 0x1000000, memsz: 0x1000, data: pattern(16, 1)}},
		pvhEntry: 0x1000010})
	k, err := LoadKernel(newSparseMemory(testMem), testMem, img)
	require.NoError(t, err)
	require.Equal(t, uint64(0x1000010), k.PVHEntry)
}

func TestLoadELFNoPVHNote(t *testing.T) {
	img := buildELF(elfSpec{entry: 0x1000000, segments: []elfSegment{{paddr: 0x1000000, memsz: 0x1000, data: pattern(16, 1)}}})
	k, err := LoadKernel(newSparseMemory(testMem), testMem, img)
	require.NoError(t, err)
	require.Zero(t, k.PVHEntry)
}

// TestLoadELFRejects corrupts a valid image one field at a time.
func TestLoadELFRejects(t *testing.T) {
	le := binary.LittleEndian
	const ph0 = elfHeaderSize                 // the PT_NOTE
	const ph1 = elfHeaderSize + elfPhdrSize   // first PT_LOAD
	const ph2 = elfHeaderSize + 2*elfPhdrSize // second PT_LOAD
	tests := map[string]func(b []byte) []byte{
		"truncated header":     func(b []byte) []byte { return b[:40] },
		"32-bit class":         func(b []byte) []byte { b[4] = 1; return b },
		"big endian":           func(b []byte) []byte { b[5] = 2; return b },
		"bad version":          func(b []byte) []byte { b[6] = 0; return b },
		"ET_DYN":               func(b []byte) []byte { le.PutUint16(b[16:], 3); return b },
		"ET_REL":               func(b []byte) []byte { le.PutUint16(b[16:], 1); return b },
		"aarch64":              func(b []byte) []byte { le.PutUint16(b[18:], 183); return b },
		"i386":                 func(b []byte) []byte { le.PutUint16(b[18:], 3); return b },
		"bad phentsize":        func(b []byte) []byte { le.PutUint16(b[54:], 32); return b },
		"no program headers":   func(b []byte) []byte { le.PutUint16(b[56:], 0); return b },
		"absurd phnum":         func(b []byte) []byte { le.PutUint16(b[56:], 0xffff); return b },
		"phoff past end":       func(b []byte) []byte { le.PutUint64(b[32:], uint64(len(b))); return b },
		"phoff overflow":       func(b []byte) []byte { le.PutUint64(b[32:], ^uint64(0)-10); return b },
		"truncated phdr table": func(b []byte) []byte { return b[:ph1+10] },
		"segment past file":    func(b []byte) []byte { le.PutUint64(b[ph1+32:], uint64(len(b))); return b },
		"segment offset overflow": func(b []byte) []byte {
			le.PutUint64(b[ph1+8:], ^uint64(0)-0xfff)
			return b
		},
		"filesz > memsz":       func(b []byte) []byte { le.PutUint64(b[ph1+40:], 0x100); return b },
		"below 1 MiB":          func(b []byte) []byte { le.PutUint64(b[ph1+24:], 0x9000); le.PutUint64(b[24:], 0x9000); return b },
		"beyond guest memory":  func(b []byte) []byte { le.PutUint64(b[ph2+24:], testMem-0x1000); return b },
		"memsz overflow":       func(b []byte) []byte { le.PutUint64(b[ph2+40:], ^uint64(0)-0x1000); return b },
		"paddr overflow":       func(b []byte) []byte { le.PutUint64(b[ph2+24:], ^uint64(0)-0x10); return b },
		"in the MMIO hole":     func(b []byte) []byte { le.PutUint64(b[ph2+24:], x86.MMIOHoleStart); return b },
		"huge bss":             func(b []byte) []byte { le.PutUint64(b[ph2+40:], 1<<40); return b },
		"bad alignment":        func(b []byte) []byte { le.PutUint64(b[ph1+48:], 0x3000); return b },
		"misaligned offset":    func(b []byte) []byte { le.PutUint64(b[ph1+8:], 0x1800); return b },
		"overlapping segments": func(b []byte) []byte { le.PutUint64(b[ph2+24:], 0x1001000); return b },
		"no PT_LOAD": func(b []byte) []byte {
			le.PutUint32(b[ph1:], 6)
			le.PutUint32(b[ph2:], 6)
			return b
		},
		"entry outside segments": func(b []byte) []byte { le.PutUint64(b[24:], 0xffffffff81000000); return b },
		"PVH entry outside":      func(b []byte) []byte { return setPVH(b, 0x2000000) },
		"PVH entry zero":         func(b []byte) []byte { return setPVH(b, 0) },
		"PVH entry above 4 GiB":  func(b []byte) []byte { return setPVH(b, 1<<32|0x1000000) },
		"note past segment": func(b []byte) []byte {
			le.PutUint64(b[ph0+32:], 20) // cut the notes mid-way
			return b
		},
		"note header truncated": func(b []byte) []byte { le.PutUint64(b[ph0+32:], 8); return b },
		"note descsz huge": func(b []byte) []byte {
			off := le.Uint64(b[ph0+8:])
			le.PutUint32(b[off+4:], 0xfffffff0)
			return b
		},
		"Xen note odd size": func(b []byte) []byte {
			// The Xen note follows a GNU note of 12+4+8 bytes.
			off := le.Uint64(b[ph0+8:]) + 24
			le.PutUint32(b[off+4:], 2)
			return b
		},
	}
	for name, corrupt := range tests {
		t.Run(name, func(t *testing.T) {
			img := corrupt(validELF())
			mem := newSparseMemory(testMem)
			_, err := LoadKernel(mem, testMem, img)
			require.ErrorIs(t, err, ErrBadImage)
			require.Zero(t, mem.writes, "nothing written for a rejected image")
		})
	}
}

// setPVH rewrites the 8-byte Xen PHYS32_ENTRY value of validELF.
func setPVH(b []byte, v uint64) []byte {
	le := binary.LittleEndian
	off := le.Uint64(b[elfHeaderSize+8:]) + 24 + 16
	le.PutUint64(b[off:], v)
	return b
}

func TestLoadKernelUnknownFormat(t *testing.T) {
	for name, img := range map[string][]byte{
		"empty":   nil,
		"garbage": pattern(4096, 5),
		"PE only": append([]byte("MZ"), make([]byte, 1000)...),
	} {
		_, err := LoadKernel(newSparseMemory(testMem), testMem, img)
		require.ErrorIs(t, err, ErrBadImage, name)
	}
}

func TestLoadKernelBadMemorySize(t *testing.T) {
	_, err := LoadKernel(newSparseMemory(testMem), 12345, validELF())
	require.ErrorIs(t, err, x86.ErrBadMemorySize)
}

func TestLoadKernelWriteError(t *testing.T) {
	mem := newSparseMemory(testMem)
	mem.failNext = true
	_, err := LoadKernel(mem, testMem, validELF())
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrBadImage)
	_, err = LoadKernel(mem, testMem, buildBzImage(defaultBz()))
	require.Error(t, err)
}
