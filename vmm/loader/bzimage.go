package loader

import (
	"encoding/binary"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// bzImage: a real-mode setup part of (setup_sects+1) 512-byte sectors,
// holding the setup header at 0x1f1, followed by the protected-mode kernel
// (the decompressor and the compressed kernel). We skip the real-mode code:
// the protected-mode kernel is loaded and entered at its 64-bit entry,
// load address + 0x200 (Documentation/arch/x86/boot.rst, "64-bit Boot
// Protocol"), with boot_params built from the image's own header.
const (
	// minBzImageVersion is 2.12, the first protocol with xloadflags, which
	// is how a kernel says it has a 64-bit entry (Linux 3.8).
	minBzImageVersion = 0x020c
	// bzImageHeaderEnd is the end of the fields we read (init_size).
	bzImageHeaderEnd = x86.SHInitSize + 4
	sectorSize       = 512
	defaultSetupSect = 4 // setup_sects 0 means 4
	entry64Offset    = 0x200
	pageMask         = 0xfff
)

func loadBzImage(mem x86.GuestWriter, memBytes uint64, image []byte) (Kernel, error) {
	le := binary.LittleEndian
	if len(image) < bzImageHeaderEnd {
		return Kernel{}, fmt.Errorf("%w: bzImage setup header truncated: %d bytes, want at least %d", ErrBadImage, len(image), bzImageHeaderEnd)
	}
	version := le.Uint16(image[x86.SHVersion:])
	if version < minBzImageVersion {
		return Kernel{}, fmt.Errorf("%w: bzImage boot protocol %d.%02d is older than 2.12, so it has no 64-bit entry; use a kernel from Linux 3.8 or later", ErrBadImage, version>>8, version&0xff)
	}
	headerEnd := 0x202 + int(image[x86.SHJump+1])
	if headerEnd < bzImageHeaderEnd || headerEnd-x86.BPSetupHeader > x86.SetupHeaderMaxSize {
		return Kernel{}, fmt.Errorf("%w: bzImage setup header ends at %#x, want %#x..%#x", ErrBadImage, headerEnd, bzImageHeaderEnd, x86.BPSetupHeader+x86.SetupHeaderMaxSize)
	}
	if headerEnd > len(image) {
		return Kernel{}, fmt.Errorf("%w: bzImage setup header ends at %#x, past the %d-byte file", ErrBadImage, headerEnd, len(image))
	}
	if xl := le.Uint16(image[x86.SHXLoadFlags:]); xl&x86.XLoadFlagKernel64 == 0 {
		return Kernel{}, fmt.Errorf("%w: bzImage has no 64-bit entry point (XLF_KERNEL_64 clear in xloadflags %#x): a 32-bit kernel?", ErrBadImage, xl)
	}
	if image[x86.SHLoadFlags]&x86.LoadFlagLoadedHigh == 0 {
		return Kernel{}, fmt.Errorf("%w: zImage (loadflags LOADED_HIGH clear) is not supported: only bzImage", ErrBadImage)
	}
	setupSects := int(image[x86.SHSetupSects])
	if setupSects == 0 {
		setupSects = defaultSetupSect
	}
	setupSize := (setupSects + 1) * sectorSize
	if setupSize >= len(image) {
		return Kernel{}, fmt.Errorf("%w: bzImage has %d setup sectors (%d bytes) but is only %d bytes: no protected-mode kernel", ErrBadImage, setupSects, setupSize, len(image))
	}
	pm := image[setupSize:]
	if len(pm) <= entry64Offset {
		return Kernel{}, fmt.Errorf("%w: bzImage protected-mode kernel of %d bytes ends before its 64-bit entry at +%#x", ErrBadImage, len(pm), entry64Offset)
	}
	if sys := uint64(le.Uint32(image[0x1f4:])) * 16; sys > uint64(len(pm)) {
		return Kernel{}, fmt.Errorf("%w: bzImage truncated: header says the protected-mode kernel is %d bytes, the file holds %d", ErrBadImage, sys, len(pm))
	}
	loadAddr := le.Uint64(image[x86.SHPrefAddress:])
	if loadAddr&pageMask != 0 {
		return Kernel{}, fmt.Errorf("%w: bzImage pref_address %#x is not page-aligned", ErrBadImage, loadAddr)
	}
	if align := le.Uint32(image[x86.SHKernelAlignment:]); align == 0 || align&(align-1) != 0 {
		return Kernel{}, fmt.Errorf("%w: bzImage kernel_alignment %#x is not a power of two", ErrBadImage, align)
	}
	initSize := uint64(le.Uint32(image[x86.SHInitSize:]))
	need := max(initSize, uint64(len(pm)))
	if err := checkRange("bzImage kernel (init_size)", loadAddr, need, memBytes); err != nil {
		return Kernel{}, err
	}
	if err := mem.WriteAt(pm, loadAddr); err != nil {
		return Kernel{}, fmt.Errorf("load bzImage protected-mode kernel at %#x: %w", loadAddr, err)
	}
	cmdlineMax := uint64(le.Uint32(image[x86.SHCmdlineSize:])) + 1
	return Kernel{
		Format:         FormatBzImage,
		Entry64:        loadAddr + entry64Offset,
		SetupHeader:    append([]byte(nil), image[x86.BPSetupHeader:headerEnd]...),
		LoadAddr:       loadAddr,
		LoadEnd:        loadAddr + need,
		InitrdAddrMax:  uint64(le.Uint32(image[x86.SHInitrdAddrMax:])),
		CmdlineMaxSize: int(min(cmdlineMax, cmdlineRoom)),
	}, nil
}
