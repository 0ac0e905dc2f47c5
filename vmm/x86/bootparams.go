package x86

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Offsets in the Linux zero page (struct boot_params), from
// Documentation/arch/x86/zero-page.rst and boot.rst. Setup-header offsets
// are absolute offsets in the zero page, which equal the offsets in a
// bzImage file.
const (
	BPExtRamdiskImage = 0x0c0 // u32: high 32 bits of ramdisk_image
	BPExtRamdiskSize  = 0x0c4 // u32: high 32 bits of ramdisk_size
	BPExtCmdLinePtr   = 0x0c8 // u32: high 32 bits of cmd_line_ptr
	BPE820Entries     = 0x1e8 // u8: number of e820_table entries
	BPSentinel        = 0x1ef // u8: must be 0, or the kernel wipes fields
	BPSetupHeader     = 0x1f1 // struct setup_header
	BPE820Table       = 0x2d0 // struct boot_e820_entry[E820MaxEntries]

	// SetupHeaderMaxSize is the room for struct setup_header: it is
	// followed by padding up to edd_mbr_sig_buffer at 0x290.
	SetupHeaderMaxSize = 0x290 - BPSetupHeader

	SHSetupSects       = 0x1f1 // u8: 512-byte real-mode sectors; 0 means 4
	SHBootFlag         = 0x1fe // u16: 0xAA55
	SHJump             = 0x200 // u16: jump; its second byte + 0x202 ends the header
	SHHeader           = 0x202 // u32: "HdrS"
	SHVersion          = 0x206 // u16: boot protocol version, 0x020f = 2.15
	SHTypeOfLoader     = 0x210 // u8
	SHLoadFlags        = 0x211 // u8
	SHCode32Start      = 0x214 // u32
	SHRamdiskImage     = 0x218 // u32
	SHRamdiskSize      = 0x21c // u32
	SHHeapEndPtr       = 0x224 // u16
	SHCmdLinePtr       = 0x228 // u32
	SHInitrdAddrMax    = 0x22c // u32: highest byte address an initrd may use
	SHKernelAlignment  = 0x230 // u32
	SHRelocatable      = 0x234 // u8
	SHMinAlignment     = 0x235 // u8: log2
	SHXLoadFlags       = 0x236 // u16
	SHCmdlineSize      = 0x238 // u32: max command line length, without NUL
	SHPayloadOffset    = 0x248 // u32
	SHPayloadLength    = 0x24c // u32
	SHPrefAddress      = 0x258 // u64
	SHInitSize         = 0x260 // u32: memory the kernel needs from its load address
	SHKernelInfoOffset = 0x268 // u32

	// E820EntrySize is the size of struct boot_e820_entry.
	E820EntrySize = 20
	// E820MaxEntries is the room in boot_params.e820_table.
	E820MaxEntries = 128
)

// Setup-header values.
const (
	BootFlagMagic  uint16 = 0xaa55
	HeaderMagic    uint32 = 0x53726448 // "HdrS"
	LoaderTypeNone uint8  = 0xff       // "undefined" boot loader ID

	LoadFlagLoadedHigh  uint8  = 1 << 0 // protected-mode kernel at 0x100000
	LoadFlagCanUseHeap  uint8  = 1 << 7 // heap_end_ptr is valid
	XLoadFlagKernel64   uint16 = 1 << 0
	XLoadFlagAbove4G    uint16 = 1 << 1
	DefaultKernelAlign  uint32 = 0x100_0000 // Linux x86-64 CONFIG_PHYSICAL_ALIGN
	protocolVersionOurs uint16 = 0x020f     // what we write for a vmlinux
	heapEnd             uint16 = 0xfe00     // end of setup heap, minus 0x200
)

// BootParamsConfig is what goes in the zero page.
type BootParamsConfig struct {
	// SetupHeader is the kernel's own setup header, from offset 0x1f1 of
	// a bzImage (loader.Kernel.SetupHeader); nil for a vmlinux, in which
	// case a minimal header is synthesised.
	SetupHeader []byte
	// CmdlineAddr is the command line's guest address (CmdlineAddr).
	CmdlineAddr uint64
	// CmdlineSize is the command line's length without its NUL; written to
	// cmdline_size only when there is no SetupHeader.
	CmdlineSize uint32
	// InitrdAddr and InitrdSize locate the initrd; both 0 without one.
	InitrdAddr, InitrdSize uint64
	// E820 is the memory map (E820Map).
	E820 []E820Entry
}

// ErrBadBootParams is returned for a BootParamsConfig that cannot be
// encoded.
var ErrBadBootParams = errors.New("bad boot parameters")

// BuildBootParams returns the ZeroPageSize-byte zero page, to be written at
// ZeroPageAddr. It fills the boot-loader fields of the setup header
// (type_of_loader 0xff, loadflags LOADED_HIGH|CAN_USE_HEAP, heap_end_ptr,
// cmd_line_ptr, ramdisk_image/size with their ext_ high halves) and the
// e820 table; for a vmlinux it also writes boot_flag, "HdrS", the protocol
// version and kernel_alignment.
func BuildBootParams(cfg BootParamsConfig) ([]byte, error) {
	if len(cfg.SetupHeader) > SetupHeaderMaxSize {
		return nil, fmt.Errorf("%w: setup header of %d bytes exceeds %d", ErrBadBootParams, len(cfg.SetupHeader), SetupHeaderMaxSize)
	}
	if len(cfg.E820) > E820MaxEntries {
		return nil, fmt.Errorf("%w: %d e820 entries exceed %d", ErrBadBootParams, len(cfg.E820), E820MaxEntries)
	}
	if cfg.CmdlineAddr == 0 {
		return nil, fmt.Errorf("%w: no command line address", ErrBadBootParams)
	}
	zp := make([]byte, ZeroPageSize)
	le := binary.LittleEndian
	if cfg.SetupHeader != nil {
		copy(zp[BPSetupHeader:], cfg.SetupHeader)
	} else {
		le.PutUint16(zp[SHBootFlag:], BootFlagMagic)
		le.PutUint32(zp[SHHeader:], HeaderMagic)
		le.PutUint16(zp[SHVersion:], protocolVersionOurs)
		le.PutUint32(zp[SHKernelAlignment:], DefaultKernelAlign)
		le.PutUint32(zp[SHCmdlineSize:], cfg.CmdlineSize)
	}
	zp[SHTypeOfLoader] = LoaderTypeNone
	zp[SHLoadFlags] |= LoadFlagLoadedHigh | LoadFlagCanUseHeap
	le.PutUint16(zp[SHHeapEndPtr:], heapEnd)
	le.PutUint32(zp[SHCmdLinePtr:], uint32(cfg.CmdlineAddr))
	le.PutUint32(zp[BPExtCmdLinePtr:], uint32(cfg.CmdlineAddr>>32))
	le.PutUint32(zp[SHRamdiskImage:], uint32(cfg.InitrdAddr))
	le.PutUint32(zp[BPExtRamdiskImage:], uint32(cfg.InitrdAddr>>32))
	le.PutUint32(zp[SHRamdiskSize:], uint32(cfg.InitrdSize))
	le.PutUint32(zp[BPExtRamdiskSize:], uint32(cfg.InitrdSize>>32))
	zp[BPSentinel] = 0
	zp[BPE820Entries] = uint8(len(cfg.E820))
	for i, e := range cfg.E820 {
		off := BPE820Table + i*E820EntrySize
		le.PutUint64(zp[off:], e.Addr)
		le.PutUint64(zp[off+8:], e.Size)
		le.PutUint32(zp[off+16:], uint32(e.Type))
	}
	return zp, nil
}
