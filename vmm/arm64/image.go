package arm64

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The arm64 Linux Image (Documentation/arm64/booting.rst) is the kernel as
// it runs, uncompressed, starting with a 64-byte header:
//
//	0x00  u32 code0, code1   branch to the kernel's entry (or "MZ" for EFI)
//	0x08  u64 text_offset    load offset from a 2 MiB-aligned base
//	0x10  u64 image_size     bytes the kernel uses from its start, bss too
//	0x18  u64 flags          bit 0 big-endian, bits 1-2 page size,
//	                         bit 3 placement anywhere
//	0x20  u64 res2..res4     reserved
//	0x38  u32 magic          "ARM\x64"
//	0x3c  u32 res5           offset of the PE header (EFI stub)
//
// All fields are little-endian since v3.17; older kernels have image_size
// 0 and are refused here.
const (
	// ImageHeaderSize is the size of the Image header.
	ImageHeaderSize = 64
	// ImageMagic is the header's magic, "ARM\x64" little-endian.
	ImageMagic uint32 = 0x644d5241
	// ImageMagicOffset is where the magic sits in the header.
	ImageMagicOffset = 0x38
	// KernelBaseAlign is the alignment of the base the kernel is loaded
	// text_offset bytes above.
	KernelBaseAlign uint64 = 2 << 20
	// MaxTextOffset bounds text_offset: the load offset inside the 2 MiB
	// kernel base (0x80000 before v5.8, 0 since).
	MaxTextOffset = KernelBaseAlign

	imageFlagBigEndian uint64 = 1 << 0
	imageFlagPageShift        = 1
	imageFlagPageMask  uint64 = 3 << imageFlagPageShift
	imageFlagAnywhere  uint64 = 1 << 3
)

// ErrBadImage is returned for a kernel that is not a bootable arm64 Image.
var ErrBadImage = errors.New("bad arm64 kernel Image")

// ImageHeader is the checked header of an arm64 Linux Image.
type ImageHeader struct {
	// TextOffset is the kernel's offset from its 2 MiB-aligned base.
	TextOffset uint64
	// ImageSize is how many bytes from the kernel's start it uses (file,
	// bss and early allocations); at least the file's length.
	ImageSize uint64
	// Flags is the raw flags field (reserved bits kept, not interpreted).
	Flags uint64
	// PageSize is the kernel's page size in bytes, 0 when unspecified.
	PageSize uint64
	// PlaceAnywhere is flags bit 3: the kernel's base may be anywhere in
	// RAM, not only near its start. We place it at RAMBase either way.
	PlaceAnywhere bool
}

// ParseImageHeader checks image's header: its magic, a non-zero image_size
// covering the whole file, a 4 KiB-aligned text_offset below 2 MiB and a
// little-endian kernel. The image is untrusted: a malformed one gets an
// error saying what is wrong.
func ParseImageHeader(image []byte) (ImageHeader, error) {
	if len(image) >= 2 && image[0] == 0x1f && image[1] == 0x8b {
		return ImageHeader{}, fmt.Errorf("%w: gzip-compressed (Image.gz); arm64 kernels do not decompress themselves, give the uncompressed Image", ErrBadImage)
	}
	if len(image) < ImageHeaderSize {
		return ImageHeader{}, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrBadImage, len(image), ImageHeaderSize)
	}
	if magic := binary.LittleEndian.Uint32(image[ImageMagicOffset:]); magic != ImageMagic {
		return ImageHeader{}, fmt.Errorf("%w: magic %#x at %#x, want %#x (\"ARM\\x64\"); is it a vmlinux or another architecture's kernel?", ErrBadImage, magic, ImageMagicOffset, ImageMagic)
	}
	h := ImageHeader{
		TextOffset: binary.LittleEndian.Uint64(image[0x08:]),
		ImageSize:  binary.LittleEndian.Uint64(image[0x10:]),
		Flags:      binary.LittleEndian.Uint64(image[0x18:]),
	}
	switch {
	case h.ImageSize == 0:
		return ImageHeader{}, fmt.Errorf("%w: image_size is 0 (a kernel older than v3.17, whose memory needs are unknown)", ErrBadImage)
	case h.ImageSize < uint64(len(image)):
		return ImageHeader{}, fmt.Errorf("%w: image_size %#x is smaller than the %#x-byte file", ErrBadImage, h.ImageSize, len(image))
	case h.ImageSize > MaxRAM:
		return ImageHeader{}, fmt.Errorf("%w: image_size %#x exceeds the largest guest RAM", ErrBadImage, h.ImageSize)
	case h.TextOffset >= MaxTextOffset || h.TextOffset%0x1000 != 0:
		return ImageHeader{}, fmt.Errorf("%w: text_offset %#x is not a 4 KiB-aligned offset below %#x", ErrBadImage, h.TextOffset, MaxTextOffset)
	case h.Flags&imageFlagBigEndian != 0:
		return ImageHeader{}, fmt.Errorf("%w: a big-endian kernel; the VMM boots little-endian guests only", ErrBadImage)
	}
	if page := (h.Flags & imageFlagPageMask) >> imageFlagPageShift; page != 0 {
		h.PageSize = 0x1000 << (2 * (page - 1)) // 1: 4K, 2: 16K, 3: 64K
	}
	h.PlaceAnywhere = h.Flags&imageFlagAnywhere != 0
	return h, nil
}
