package loader

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// sparseMemory is guest memory of a given size kept as 4 KiB pages that
// exist only once written with non-zero data, so tests and fuzzing can use
// gigabyte-sized guests. Out-of-range writes return an error.
type sparseMemory struct {
	size     uint64
	pages    map[uint64][]byte
	lowest   uint64 // lowest address written
	highest  uint64 // end of the highest write
	writes   int
	failNext bool
}

func newSparseMemory(size uint64) *sparseMemory {
	return &sparseMemory{size: size, pages: map[uint64][]byte{}, lowest: ^uint64(0)}
}

func (m *sparseMemory) WriteAt(p []byte, gpa uint64) error {
	if m.failNext {
		return fmt.Errorf("injected write failure")
	}
	if gpa > m.size || uint64(len(p)) > m.size-gpa {
		return fmt.Errorf("write [%#x, +%#x) outside %#x bytes of guest memory", gpa, len(p), m.size)
	}
	m.writes++
	m.lowest = min(m.lowest, gpa)
	m.highest = max(m.highest, gpa+uint64(len(p)))
	for len(p) > 0 {
		page, off := gpa&^0xfff, gpa&0xfff
		n := min(uint64(len(p)), 0x1000-off)
		buf, ok := m.pages[page]
		if !ok && !allZero(p[:n]) {
			buf = make([]byte, 0x1000)
			m.pages[page] = buf
		}
		if buf != nil {
			copy(buf[off:], p[:n])
		}
		p = p[n:]
		gpa += n
	}
	return nil
}

func (m *sparseMemory) read(gpa uint64, n int) []byte {
	out := make([]byte, n)
	for done := 0; done < n; {
		a := gpa + uint64(done)
		c := min(n-done, int(0x1000-a&0xfff))
		if buf, ok := m.pages[a&^0xfff]; ok {
			copy(out[done:done+c], buf[a&0xfff:])
		}
		done += c
	}
	return out
}

var zeroPage [0x1000]byte

// allZero reports whether b (at most a page) is all zero bytes.
func allZero(b []byte) bool { return bytes.Equal(b, zeroPage[:len(b)]) }

// elfSegment is one PT_LOAD of a test ELF.
type elfSegment struct {
	paddr, memsz uint64
	data         []byte
}

// elfSpec describes a test vmlinux.
type elfSpec struct {
	entry    uint64
	segments []elfSegment
	pvhEntry uint64 // 0: no Xen note
	pvh8     bool   // 8-byte note descriptor, as Linux writes it
	// align is the segments' file alignment and p_align; 0 means 4 KiB.
	// Fuzz seeds use a small one to stay small.
	align uint64
}

const testVirtBase = 0xffffffff80000000

// buildELF returns an ELF64 x86-64 executable: header, program headers,
// an optional PT_NOTE with an unrelated note then the Xen PHYS32_ENTRY
// note, and the segments' data, each at a 4 KiB-aligned offset.
func buildELF(s elfSpec) []byte {
	le := binary.LittleEndian
	nph := len(s.segments)
	var notes []byte
	if s.pvhEntry != 0 {
		notes = appendNote(notes, "GNU", 3, []byte{1, 2, 3, 4, 5, 6, 7, 8})
		desc := le.AppendUint32(nil, uint32(s.pvhEntry))
		if s.pvh8 {
			desc = le.AppendUint64(nil, s.pvhEntry)
		}
		notes = appendNote(notes, "Xen", xenNotePhys32Entry, desc)
		nph++
	}
	align := s.align
	if align == 0 {
		align = 0x1000
	}
	headers := uint64(elfHeaderSize + nph*elfPhdrSize + len(notes))
	img := make([]byte, (headers+align-1)&^(align-1))
	copy(img, elfMagic)
	img[4], img[5], img[6] = elfClass64, elfData2LSB, elfVersionCurrent
	le.PutUint16(img[16:], elfTypeExec)
	le.PutUint16(img[18:], elfMachineX86_64)
	le.PutUint32(img[20:], 1)
	le.PutUint64(img[24:], s.entry)
	le.PutUint64(img[32:], elfHeaderSize)
	le.PutUint16(img[52:], elfHeaderSize)
	le.PutUint16(img[54:], elfPhdrSize)
	le.PutUint16(img[56:], uint16(nph))
	ph := img[elfHeaderSize:]
	if notes != nil {
		noteOff := uint64(elfHeaderSize + nph*elfPhdrSize)
		copy(img[noteOff:], notes)
		le.PutUint32(ph[0:], ptNote)
		le.PutUint64(ph[8:], noteOff)
		le.PutUint64(ph[32:], uint64(len(notes)))
		le.PutUint64(ph[40:], uint64(len(notes)))
		le.PutUint64(ph[48:], 4)
		ph = ph[elfPhdrSize:]
	}
	off := uint64(len(img))
	for _, seg := range s.segments {
		le.PutUint32(ph[0:], ptLoad)
		le.PutUint32(ph[4:], 7)
		le.PutUint64(ph[8:], off)
		le.PutUint64(ph[16:], testVirtBase+seg.paddr)
		le.PutUint64(ph[24:], seg.paddr)
		le.PutUint64(ph[32:], uint64(len(seg.data)))
		le.PutUint64(ph[40:], seg.memsz)
		le.PutUint64(ph[48:], align)
		ph = ph[elfPhdrSize:]
		off += (uint64(len(seg.data)) + align - 1) &^ (align - 1)
	}
	// Append the data only now: appending may move img, and ph points
	// into it.
	for _, seg := range s.segments {
		img = append(img, seg.data...)
		for uint64(len(img))%align != 0 {
			img = append(img, 0)
		}
	}
	return img
}

func appendNote(b []byte, name string, typ uint32, desc []byte) []byte {
	le := binary.LittleEndian
	b = le.AppendUint32(b, uint32(len(name)+1))
	b = le.AppendUint32(b, uint32(len(desc)))
	b = le.AppendUint32(b, typ)
	b = append(b, name...)
	b = append(b, 0)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	b = append(b, desc...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// pattern returns n recognisable bytes.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed | 1
	}
	return b
}

// validELF is a small vmlinux: text at 16 MiB with a PVH note, and a data
// segment with a bss tail.
func validELF() []byte {
	return buildELF(elfSpec{
		entry: 0x1000000,
		segments: []elfSegment{
			{paddr: 0x1000000, memsz: 0x3000, data: pattern(0x2345, 1)},
			{paddr: 0x1200000, memsz: 0x5000, data: pattern(0x1000, 2)},
		},
		pvhEntry: 0x1000040,
		pvh8:     true,
	})
}

// bzSpec describes a test bzImage.
type bzSpec struct {
	setupSects  uint8
	version     uint16
	xloadflags  uint16
	loadflags   uint8
	prefAddress uint64
	initSize    uint32
	cmdlineSize uint32
	initrdMax   uint32
	kernel      []byte
}

func defaultBz() bzSpec {
	return bzSpec{
		setupSects: 1, version: 0x020f, xloadflags: x86.XLoadFlagKernel64 | x86.XLoadFlagAbove4G,
		loadflags: x86.LoadFlagLoadedHigh, prefAddress: 0x1000000, initSize: 0x40000,
		cmdlineSize: 2047, initrdMax: 0x7fffffff, kernel: pattern(0x3000, 3),
	}
}

// buildBzImage returns a bzImage whose real-mode part is (setupSects+1)
// sectors with a valid setup header, followed by the protected-mode kernel.
func buildBzImage(s bzSpec) []byte {
	le := binary.LittleEndian
	sects := int(s.setupSects)
	if sects == 0 {
		sects = 4
	}
	img := make([]byte, (sects+1)*512)
	img[x86.SHSetupSects] = s.setupSects
	le.PutUint32(img[0x1f4:], uint32(len(s.kernel)/16))
	le.PutUint16(img[x86.SHBootFlag:], x86.BootFlagMagic)
	img[x86.SHJump] = 0xeb
	img[x86.SHJump+1] = 0x6a // header ends at 0x26c
	le.PutUint32(img[x86.SHHeader:], x86.HeaderMagic)
	le.PutUint16(img[x86.SHVersion:], s.version)
	img[x86.SHLoadFlags] = s.loadflags
	le.PutUint32(img[x86.SHCode32Start:], 0x100000)
	le.PutUint32(img[x86.SHInitrdAddrMax:], s.initrdMax)
	le.PutUint32(img[x86.SHKernelAlignment:], 0x200000)
	img[x86.SHRelocatable] = 1
	img[x86.SHMinAlignment] = 21
	le.PutUint16(img[x86.SHXLoadFlags:], s.xloadflags)
	le.PutUint32(img[x86.SHCmdlineSize:], s.cmdlineSize)
	le.PutUint64(img[x86.SHPrefAddress:], s.prefAddress)
	le.PutUint32(img[x86.SHInitSize:], s.initSize)
	return append(img, s.kernel...)
}
