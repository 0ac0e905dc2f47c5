package loader

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// Format is a kernel image format.
type Format int

// The kernel image formats LoadKernel understands.
const (
	FormatELF     Format = iota + 1 // uncompressed vmlinux
	FormatBzImage                   // compressed bzImage
)

func (f Format) String() string {
	switch f {
	case FormatELF:
		return "ELF vmlinux"
	case FormatBzImage:
		return "bzImage"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Kernel describes a loaded kernel.
type Kernel struct {
	Format Format
	// Entry64 is the 64-bit Linux boot protocol entry point (startup_64):
	// enter in long mode with RSI = x86.ZeroPageAddr.
	Entry64 uint64
	// PVHEntry is the 32-bit PVH entry point from the ELF note
	// XEN_ELFNOTE_PHYS32_ENTRY; 0 when the image has none (always for a
	// bzImage).
	PVHEntry uint64
	// SetupHeader is a bzImage's setup header, bytes 0x1f1 up to the end
	// the header gives, for x86.BootParamsConfig; nil for a vmlinux.
	SetupHeader []byte
	// LoadAddr and LoadEnd bound the guest memory the kernel owns: its
	// segments with their bss, or for a bzImage the init_size it needs
	// to decompress in place. Nothing else may be put there.
	LoadAddr, LoadEnd uint64
	// InitrdAddrMax is the highest byte address the kernel accepts for
	// an initrd.
	InitrdAddrMax uint64
	// CmdlineMaxSize is the longest command line the kernel accepts,
	// including its NUL.
	CmdlineMaxSize int
}

// ErrBadImage is wrapped by every rejection of a malformed kernel image.
var ErrBadImage = errors.New("bad kernel image")

// elfMagic and the bzImage magics identify the format.
var elfMagic = []byte{0x7f, 'E', 'L', 'F'}

// LoadKernel detects the format of image, checks it, and copies it into
// guest memory of memBytes bytes laid out as x86.MemoryRegions: the kernel
// must fit between x86.HighMemStart and the end of low RAM (the MMIO hole
// or memBytes). A vmlinux's PT_LOAD segments go at their p_paddr; a
// bzImage's protected-mode kernel at its pref_address.
func LoadKernel(mem x86.GuestWriter, memBytes uint64, image []byte) (Kernel, error) {
	if err := x86.CheckMemorySize(memBytes); err != nil {
		return Kernel{}, err
	}
	switch {
	case bytes.HasPrefix(image, elfMagic):
		return loadELF(mem, memBytes, image)
	case isBzImage(image):
		return loadBzImage(mem, memBytes, image)
	}
	return Kernel{}, fmt.Errorf("%w: neither an ELF vmlinux (no \\x7fELF magic) nor a bzImage (no 0xAA55 boot flag and \"HdrS\" at 0x1fe/0x202)", ErrBadImage)
}

func isBzImage(image []byte) bool {
	return len(image) >= x86.SHHeader+4 &&
		binary.LittleEndian.Uint16(image[x86.SHBootFlag:]) == x86.BootFlagMagic &&
		binary.LittleEndian.Uint32(image[x86.SHHeader:]) == x86.HeaderMagic
}

// lowRAMEnd is the end of the RAM below the MMIO hole, where kernels and
// initrds go.
func lowRAMEnd(memBytes uint64) uint64 {
	return min(memBytes, x86.MMIOHoleStart)
}

// checkRange checks that [addr, addr+size) lies in [x86.HighMemStart,
// lowRAMEnd) without overflow.
func checkRange(what string, addr, size, memBytes uint64) error {
	end := lowRAMEnd(memBytes)
	if addr < x86.HighMemStart {
		return fmt.Errorf("%w: %s at %#x is below 1 MiB, where the boot data lives", ErrBadImage, what, addr)
	}
	if size > end || addr > end-size {
		return fmt.Errorf("%w: %s [%#x, +%#x) does not fit in guest RAM below %#x; give the guest more memory or check the image", ErrBadImage, what, addr, size, end)
	}
	return nil
}

// writeZeros zeroes [gpa, gpa+n) in chunks, so a large bss costs no large
// allocation.
func writeZeros(mem x86.GuestWriter, gpa, n uint64) error {
	const chunk = 64 << 10
	zeros := make([]byte, min(n, chunk))
	for n > 0 {
		c := min(n, chunk)
		if err := mem.WriteAt(zeros[:c], gpa); err != nil {
			return err
		}
		gpa += c
		n -= c
	}
	return nil
}
