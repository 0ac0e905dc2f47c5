package machine

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/vmm/loader"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// bootImages are a machine's kernel and initrd until Start has copied
// them into guest memory. A kernel read from a file is mapped, not read:
// its pages are the page cache's, so a warm start costs no read and the
// VMM's heap never holds the ~17 MiB image.
type bootImages struct {
	kernel []byte
	unmap  func() // releases kernel's mapping; nil for bytes from Config
	initrd loader.InitrdSource
}

// release drops the kernel mapping. Idempotent.
func (b *bootImages) release() {
	if b.unmap != nil {
		b.unmap()
		b.unmap = nil
	}
	b.kernel, b.initrd = nil, nil
}

// images resolves cfg's kernel and initrd.
func (c Config) images() (_ bootImages, err error) {
	var b bootImages
	switch {
	case c.KernelImage != nil:
		b.kernel = c.KernelImage
	case c.Kernel == "":
		return b, errors.New("machine: no kernel: set Config.Kernel (a vmlinux or bzImage path)")
	default:
		if b.kernel, b.unmap, err = mapFile(c.Kernel); err != nil {
			return b, fmt.Errorf("machine: reading the kernel: %w", err)
		}
	}
	defer func() {
		if err != nil {
			b.release()
		}
	}()
	switch {
	case c.InitrdSource != nil:
		b.initrd = c.InitrdSource
	case c.InitrdImage != nil:
		b.initrd = loader.InitrdBytes(c.InitrdImage)
	case c.Initrd != "":
		f, err := openInitrdFile(c.Initrd)
		if err != nil {
			return b, fmt.Errorf("machine: reading the initrd: %w", err)
		}
		b.initrd = f
	}
	return b, nil
}

// mapFile maps path read-only and privately.
func mapFile(path string) ([]byte, func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	switch size := info.Size(); {
	case !info.Mode().IsRegular():
		return nil, nil, fmt.Errorf("%s is not a regular file", path)
	case size == 0:
		return nil, nil, fmt.Errorf("%s is empty", path)
	case size > maxImageSize:
		return nil, nil, fmt.Errorf("%s is %d MiB, more than the %d MiB a kernel image may be", path, size>>20, maxImageSize>>20)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(info.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, fmt.Errorf("mapping %s: %w", path, err)
	}
	return data, func() { _ = unix.Munmap(data) }, nil
}

// maxImageSize bounds a kernel image: guest RAM below the MMIO hole.
const maxImageSize = 3 << 30

// initrdFile is an initrd streamed from a host file into guest memory.
type initrdFile struct {
	path string
	size uint64
}

func openInitrdFile(path string) (initrdFile, error) {
	info, err := os.Stat(path)
	if err != nil {
		return initrdFile{}, err
	}
	if !info.Mode().IsRegular() {
		return initrdFile{}, fmt.Errorf("%s is not a regular file", path)
	}
	return initrdFile{path: path, size: uint64(info.Size())}, nil
}

// Size implements loader.InitrdSource.
func (f initrdFile) Size() uint64 { return f.size }

// WriteTo implements loader.InitrdSource.
func (f initrdFile) WriteTo(mem x86.GuestWriter, addr uint64) error {
	src, err := os.Open(f.path)
	if err != nil {
		return err
	}
	defer src.Close()
	err = loader.WriteStream(mem, addr, f.size, func(w io.Writer) error {
		_, err := io.Copy(w, src)
		return err
	})
	if err != nil {
		return fmt.Errorf("copying the initrd %s (did it change while it was loaded?): %w", f.path, err)
	}
	return nil
}
