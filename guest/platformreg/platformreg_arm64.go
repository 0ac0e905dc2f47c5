package platformreg

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Device is where the register is reached from userspace: /dev/mem
// (CONFIG_DEVMEM). arm64's /dev/mem reads and writes only RAM, so the page
// is mapped; STRICT_DEVMEM allows that for a page no driver claims.
func (Register) Device() string { return "/dev/mem" }

// Open maps reg's MMIO page from /dev/mem.
func Open(reg Register) (IO, error) {
	f, err := os.OpenFile(reg.Device(), os.O_RDWR|os.O_SYNC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	page, err := unix.Mmap(int(f.Fd()), reg.mmio, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping MMIO page %#x from %s: %w", reg.mmio, reg.Device(), err)
	}
	return &mmioIO{page: page}, nil
}

// mmioIO is a register at the start of a mapped MMIO page. Each access is
// one single-byte load or store, which traps to the VMM (KVM decodes it
// from the fault's syndrome).
type mmioIO struct {
	page []byte
}

func (m *mmioIO) ReadByte() (byte, error) {
	return *(*byte)(unsafe.Pointer(&m.page[0])), nil
}

func (m *mmioIO) WriteByte(v byte) error {
	*(*byte)(unsafe.Pointer(&m.page[0])) = v
	return nil
}

func (m *mmioIO) Close() error { return unix.Munmap(m.page) }
