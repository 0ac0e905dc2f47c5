package x86

import (
	"errors"
	"fmt"
)

// E820Type is the type of an e820 memory map entry.
type E820Type uint32

// The e820 types the VMM uses.
const (
	E820RAM      E820Type = 1
	E820Reserved E820Type = 2
)

// E820Entry is one range of the guest's physical memory map.
type E820Entry struct {
	Addr uint64
	Size uint64
	Type E820Type
}

// MemoryRegion is one contiguous range of guest RAM the VMM must back with
// host memory (one KVM memory slot each).
type MemoryRegion struct {
	GPA  uint64
	Size uint64
}

// ErrBadMemorySize is returned for a guest RAM size the layout cannot hold.
var ErrBadMemorySize = errors.New("bad guest memory size")

// CheckMemorySize reports whether memBytes is a usable guest RAM size: a
// multiple of 4 KiB, above HighMemStart (the kernel loads above 1 MiB) and at
// most MaxGuestMemory.
func CheckMemorySize(memBytes uint64) error {
	switch {
	case memBytes%0x1000 != 0:
		return fmt.Errorf("%w: %d bytes is not a multiple of 4 KiB", ErrBadMemorySize, memBytes)
	case memBytes <= HighMemStart:
		return fmt.Errorf("%w: %d bytes leaves no RAM above 1 MiB for the kernel", ErrBadMemorySize, memBytes)
	case memBytes > MaxGuestMemory:
		return fmt.Errorf("%w: %d bytes exceeds the %d-byte maximum", ErrBadMemorySize, memBytes, MaxGuestMemory)
	}
	return nil
}

// MemoryRegions splits memBytes of guest RAM around the 32-bit MMIO hole:
// [0, min(memBytes, MMIOHoleStart)) and, when memBytes exceeds
// MMIOHoleStart, [MMIOHoleEnd, MMIOHoleEnd+memBytes-MMIOHoleStart). The
// first region covers the EBDA and the 0xa0000..0xfffff legacy range too:
// they are reserved in e820, not absent, and the MP table lives there.
func MemoryRegions(memBytes uint64) ([]MemoryRegion, error) {
	if err := CheckMemorySize(memBytes); err != nil {
		return nil, err
	}
	low := min(memBytes, MMIOHoleStart)
	regions := []MemoryRegion{{GPA: 0, Size: low}}
	if memBytes > MMIOHoleStart {
		regions = append(regions, MemoryRegion{GPA: MMIOHoleEnd, Size: memBytes - MMIOHoleStart})
	}
	return regions, nil
}

// E820Map returns the guest's e820 map for memBytes of RAM laid out as
// MemoryRegions says: RAM below the EBDA, the EBDA and legacy BIOS area
// reserved up to 1 MiB, RAM from 1 MiB to the MMIO hole, and RAM above
// 4 GiB for what did not fit below the hole. The hole itself is left out:
// Linux treats gaps as MMIO space.
func E820Map(memBytes uint64) ([]E820Entry, error) {
	regions, err := MemoryRegions(memBytes)
	if err != nil {
		return nil, err
	}
	entries := []E820Entry{
		{Addr: 0, Size: EBDAStart, Type: E820RAM},
		{Addr: EBDAStart, Size: HighMemStart - EBDAStart, Type: E820Reserved},
		{Addr: HighMemStart, Size: regions[0].Size - HighMemStart, Type: E820RAM},
	}
	if len(regions) > 1 {
		entries = append(entries, E820Entry{Addr: regions[1].GPA, Size: regions[1].Size, Type: E820RAM})
	}
	return entries, nil
}
