package loader

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// ELF64 constants (the System V gABI and its x86-64 supplement).
const (
	elfHeaderSize     = 64
	elfPhdrSize       = 56
	elfClass64        = 2
	elfData2LSB       = 1
	elfVersionCurrent = 1
	elfTypeExec       = 2
	elfMachineX86_64  = 62
	ptLoad            = 1
	ptNote            = 4
	// maxProgramHeaders bounds e_phnum: a vmlinux has about five.
	maxProgramHeaders = 128
	// xenNotePhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY: the 32-bit PVH
	// entry point's physical address.
	xenNotePhys32Entry = 18
)

type programHeader struct {
	typ                  uint32
	offset, paddr        uint64
	filesz, memsz, align uint64
	vaddr                uint64
}

// loadELF checks a vmlinux (ELF64, x86-64, ET_EXEC) and writes its
// PT_LOAD segments at their physical addresses, zeroing their bss.
func loadELF(mem x86.GuestWriter, memBytes uint64, image []byte) (Kernel, error) {
	entry, phoff, phnum, err := parseELFHeader(image)
	if err != nil {
		return Kernel{}, err
	}
	loads, pvhEntry, err := readProgramHeaders(image, phoff, phnum, memBytes)
	if err != nil {
		return Kernel{}, err
	}
	if err := checkSegmentLayout(loads, entry, pvhEntry); err != nil {
		return Kernel{}, err
	}
	for _, ph := range loads {
		if err := mem.WriteAt(image[ph.offset:ph.offset+ph.filesz], ph.paddr); err != nil {
			return Kernel{}, fmt.Errorf("load ELF segment at %#x: %w", ph.paddr, err)
		}
		if err := writeZeros(mem, ph.paddr+ph.filesz, ph.memsz-ph.filesz); err != nil {
			return Kernel{}, fmt.Errorf("zero ELF bss at %#x: %w", ph.paddr+ph.filesz, err)
		}
	}
	last := loads[len(loads)-1]
	return Kernel{
		Format:         FormatELF,
		Entry64:        entry,
		PVHEntry:       pvhEntry,
		LoadAddr:       loads[0].paddr,
		LoadEnd:        last.paddr + last.memsz,
		InitrdAddrMax:  x86.DefaultInitrdAddrMax,
		CmdlineMaxSize: x86.CmdlineMaxSize,
	}, nil
}

// parseELFHeader checks the ELF header of a 64-bit x86 executable and
// returns its entry point and where its program header table is (which it
// checks lies inside the file).
func parseELFHeader(image []byte) (entry, phoff uint64, phnum uint16, err error) {
	if len(image) < elfHeaderSize {
		return 0, 0, 0, fmt.Errorf("%w: ELF header truncated: %d bytes, want %d", ErrBadImage, len(image), elfHeaderSize)
	}
	le := binary.LittleEndian
	switch {
	case image[4] != elfClass64:
		return 0, 0, 0, fmt.Errorf("%w: ELF class %d is not ELFCLASS64; a 64-bit x86 vmlinux is needed", ErrBadImage, image[4])
	case image[5] != elfData2LSB:
		return 0, 0, 0, fmt.Errorf("%w: ELF data encoding %d is not little-endian", ErrBadImage, image[5])
	case image[6] != elfVersionCurrent:
		return 0, 0, 0, fmt.Errorf("%w: ELF version %d is not 1", ErrBadImage, image[6])
	}
	if t := le.Uint16(image[16:]); t != elfTypeExec {
		return 0, 0, 0, fmt.Errorf("%w: ELF type %d is not ET_EXEC; a vmlinux is an executable, not a relocatable object or shared library", ErrBadImage, t)
	}
	if m := le.Uint16(image[18:]); m != elfMachineX86_64 {
		return 0, 0, 0, fmt.Errorf("%w: ELF machine %d is not x86-64 (62)", ErrBadImage, m)
	}
	entry = le.Uint64(image[24:])
	phoff = le.Uint64(image[32:])
	phentsize := le.Uint16(image[54:])
	phnum = le.Uint16(image[56:])
	if phentsize != elfPhdrSize {
		return 0, 0, 0, fmt.Errorf("%w: ELF program header size %d, want %d", ErrBadImage, phentsize, elfPhdrSize)
	}
	if phnum == 0 || phnum > maxProgramHeaders {
		return 0, 0, 0, fmt.Errorf("%w: %d ELF program headers, want 1..%d", ErrBadImage, phnum, maxProgramHeaders)
	}
	tableSize := uint64(phnum) * elfPhdrSize
	if phoff > uint64(len(image)) || tableSize > uint64(len(image))-phoff {
		return 0, 0, 0, fmt.Errorf("%w: ELF program header table [%#x, +%#x) runs past the end of the %d-byte file", ErrBadImage, phoff, tableSize, len(image))
	}
	return entry, phoff, phnum, nil
}

// readProgramHeaders returns the PT_LOAD segments, each checked against
// the file and guest memory (memBytes), sorted by physical address, and the
// PVH entry point found in the PT_NOTE segments (0: none).
func readProgramHeaders(image []byte, phoff uint64, phnum uint16, memBytes uint64) (loads []programHeader, pvhEntry uint64, err error) {
	le := binary.LittleEndian
	for i := range int(phnum) {
		b := image[phoff+uint64(i)*elfPhdrSize:]
		ph := programHeader{
			typ:    le.Uint32(b[0:]),
			offset: le.Uint64(b[8:]),
			vaddr:  le.Uint64(b[16:]),
			paddr:  le.Uint64(b[24:]),
			filesz: le.Uint64(b[32:]),
			memsz:  le.Uint64(b[40:]),
			align:  le.Uint64(b[48:]),
		}
		if ph.typ != ptLoad && ph.typ != ptNote {
			continue
		}
		if ph.offset > uint64(len(image)) || ph.filesz > uint64(len(image))-ph.offset {
			return nil, 0, fmt.Errorf("%w: ELF segment %d [%#x, +%#x) runs past the end of the %d-byte file", ErrBadImage, i, ph.offset, ph.filesz, len(image))
		}
		if ph.typ == ptNote {
			e, err := findPVHEntry(image[ph.offset : ph.offset+ph.filesz])
			if err != nil {
				return nil, 0, fmt.Errorf("ELF note segment %d: %w", i, err)
			}
			if e != 0 {
				pvhEntry = e
			}
			continue
		}
		if err := checkLoadSegment(i, ph, memBytes); err != nil {
			return nil, 0, err
		}
		loads = append(loads, ph)
	}
	if len(loads) == 0 {
		return nil, 0, fmt.Errorf("%w: ELF has no PT_LOAD segment", ErrBadImage)
	}
	slices.SortFunc(loads, func(a, b programHeader) int { return cmpUint64(a.paddr, b.paddr) })
	return loads, pvhEntry, nil
}

// checkLoadSegment checks PT_LOAD segment i: its sizes, its alignment and
// that it fits in guest memory.
func checkLoadSegment(i int, ph programHeader, memBytes uint64) error {
	if ph.filesz > ph.memsz {
		return fmt.Errorf("%w: ELF segment %d has %#x file bytes but only %#x memory bytes", ErrBadImage, i, ph.filesz, ph.memsz)
	}
	if ph.align > 1 {
		if ph.align&(ph.align-1) != 0 {
			return fmt.Errorf("%w: ELF segment %d alignment %#x is not a power of two", ErrBadImage, i, ph.align)
		}
		if (ph.offset-ph.vaddr)&(ph.align-1) != 0 {
			return fmt.Errorf("%w: ELF segment %d offset %#x and address %#x disagree modulo alignment %#x", ErrBadImage, i, ph.offset, ph.vaddr, ph.align)
		}
	}
	return checkRange(fmt.Sprintf("ELF segment %d", i), ph.paddr, ph.memsz, memBytes)
}

// checkSegmentLayout checks that the sorted segments do not overlap and
// that the entry points lie inside them.
func checkSegmentLayout(loads []programHeader, entry, pvhEntry uint64) error {
	for i := 1; i < len(loads); i++ {
		if prev := loads[i-1]; prev.paddr+prev.memsz > loads[i].paddr {
			return fmt.Errorf("%w: ELF segments at %#x and %#x overlap", ErrBadImage, prev.paddr, loads[i].paddr)
		}
	}
	inSegment := func(addr uint64) bool {
		for _, ph := range loads {
			if addr >= ph.paddr && addr-ph.paddr < ph.memsz {
				return true
			}
		}
		return false
	}
	if !inSegment(entry) {
		return fmt.Errorf("%w: ELF entry point %#x is outside every loadable segment (is this a vmlinux with a physical entry?)", ErrBadImage, entry)
	}
	if pvhEntry != 0 && !inSegment(pvhEntry) {
		return fmt.Errorf("%w: PVH entry point %#x is outside every loadable segment", ErrBadImage, pvhEntry)
	}
	return nil
}

// findPVHEntry walks the notes of one PT_NOTE segment and returns the
// XEN_ELFNOTE_PHYS32_ENTRY value, or 0 if there is none. Each note is a
// 12-byte header (namesz, descsz, type) then the name and the descriptor,
// each padded to 4 bytes.
func findPVHEntry(notes []byte) (uint64, error) {
	le := binary.LittleEndian
	var entry uint64
	for len(notes) > 0 {
		if len(notes) < 12 {
			return 0, fmt.Errorf("%w: ELF note header truncated (%d bytes left)", ErrBadImage, len(notes))
		}
		namesz, descsz, typ := uint64(le.Uint32(notes[0:])), uint64(le.Uint32(notes[4:])), le.Uint32(notes[8:])
		nameEnd := 12 + align4(namesz)
		descEnd := nameEnd + align4(descsz)
		if descEnd > uint64(len(notes)) {
			return 0, fmt.Errorf("%w: ELF note (name %d bytes, descriptor %d bytes) runs past its segment", ErrBadImage, namesz, descsz)
		}
		name := notes[12 : 12+namesz]
		desc := notes[nameEnd : nameEnd+descsz]
		if typ == xenNotePhys32Entry && bytes.Equal(bytes.TrimRight(name, "\x00"), []byte("Xen")) {
			switch len(desc) {
			case 4:
				entry = uint64(le.Uint32(desc))
			case 8:
				entry = le.Uint64(desc)
			default:
				return 0, fmt.Errorf("%w: Xen PHYS32_ENTRY note has a %d-byte value, want 4 or 8", ErrBadImage, len(desc))
			}
			if entry == 0 || entry > 0xffffffff {
				return 0, fmt.Errorf("%w: PVH entry point %#x is not a 32-bit physical address", ErrBadImage, entry)
			}
		}
		notes = notes[descEnd:]
	}
	return entry, nil
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
