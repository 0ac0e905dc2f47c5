package x86

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// PVH boot (xen/include/public/arch-x86/hvm/start_info.h): the kernel's
// 32-bit PVH entry (ELF note XEN_ELFNOTE_PHYS32_ENTRY) gets EBX pointing at
// struct hvm_start_info, which locates the command line, the modules (the
// initrd) and the memory map.
const (
	PVHStartMagic       uint32 = 0x336ec578 // XEN_HVM_START_MAGIC_VALUE
	pvhStartInfoVersion        = 1          // version 1 has the memory map
	pvhStartInfoSize           = 56
	pvhModlistEntrySize        = 32
	pvhMemmapEntrySize         = 24
	// PVHMaxMemmapEntries is the room between PVHMemmapAddr and
	// ZeroPageAddr.
	PVHMaxMemmapEntries = int((ZeroPageAddr - PVHMemmapAddr) / pvhMemmapEntrySize)
)

// PVHConfig is what hvm_start_info describes.
type PVHConfig struct {
	CmdlineAddr            uint64
	InitrdAddr, InitrdSize uint64 // both 0 without an initrd
	E820                   []E820Entry
}

// ErrBadPVHConfig is returned for a PVHConfig that cannot be encoded.
var ErrBadPVHConfig = errors.New("bad PVH start info")

// PVHStartInfo returns hvm_start_info (for PVHStartInfoAddr), the module
// list (for PVHModlistAddr; empty without an initrd) and the memory map (for
// PVHMemmapAddr).
func PVHStartInfo(cfg PVHConfig) (startInfo, modlist, memmap []byte, err error) {
	if len(cfg.E820) == 0 || len(cfg.E820) > PVHMaxMemmapEntries {
		return nil, nil, nil, fmt.Errorf("%w: %d memory map entries, want 1..%d", ErrBadPVHConfig, len(cfg.E820), PVHMaxMemmapEntries)
	}
	le := binary.LittleEndian
	startInfo = make([]byte, pvhStartInfoSize)
	le.PutUint32(startInfo[0:], PVHStartMagic)
	le.PutUint32(startInfo[4:], pvhStartInfoVersion)
	if cfg.InitrdSize > 0 {
		modlist = make([]byte, pvhModlistEntrySize)
		le.PutUint64(modlist[0:], cfg.InitrdAddr)
		le.PutUint64(modlist[8:], cfg.InitrdSize)
		le.PutUint32(startInfo[12:], 1) // nr_modules
		le.PutUint64(startInfo[16:], PVHModlistAddr)
	}
	le.PutUint64(startInfo[24:], cfg.CmdlineAddr)
	le.PutUint64(startInfo[40:], PVHMemmapAddr)
	le.PutUint32(startInfo[48:], uint32(len(cfg.E820)))
	memmap = make([]byte, len(cfg.E820)*pvhMemmapEntrySize)
	for i, e := range cfg.E820 {
		m := memmap[i*pvhMemmapEntrySize:]
		le.PutUint64(m[0:], e.Addr)
		le.PutUint64(m[8:], e.Size)
		le.PutUint32(m[16:], uint32(e.Type)) // XEN_HVM_MEMMAP_TYPE_* = e820 types
	}
	return startInfo, modlist, memmap, nil
}

// WritePVHStartInfo writes PVHStartInfo's three blobs at their addresses.
func WritePVHStartInfo(mem GuestWriter, cfg PVHConfig) error {
	startInfo, modlist, memmap, err := PVHStartInfo(cfg)
	if err != nil {
		return err
	}
	for _, w := range []struct {
		what string
		data []byte
		gpa  uint64
	}{
		{"PVH start info", startInfo, PVHStartInfoAddr},
		{"PVH module list", modlist, PVHModlistAddr},
		{"PVH memory map", memmap, PVHMemmapAddr},
	} {
		if len(w.data) == 0 {
			continue
		}
		if err := mem.WriteAt(w.data, w.gpa); err != nil {
			return fmt.Errorf("write %s at %#x: %w", w.what, w.gpa, err)
		}
	}
	return nil
}
