package kvm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
	"github.com/cowork-vmm/cowork-vmm/machine"
)

// rootDisk is the profile's root disk attached to a VM: the image file,
// held open and locked for the VM's life, and its virtio-blk device.
type rootDisk struct {
	file *os.File
	dev  *blk.Device
}

// attachRootDisk opens the image at path (helper.GuestConfig.RootDisk),
// locks it against a second VM on the same disk, and attaches it to m as
// a writable virtio-blk disk. On error nothing is left open.
func (g *guest) attachRootDisk(m *machine.Machine, path string) error {
	f, err := openRootDisk(path)
	if err != nil {
		return err
	}
	dev, err := blk.New(f, blk.Options{Serial: blk.DefaultSerial, Logger: g.log})
	if err != nil {
		f.Close()
		return err
	}
	if _, err := m.AddVirtioMMIO(dev); err != nil {
		f.Close()
		return fmt.Errorf("attaching the root disk: %w", err)
	}
	g.disk = &rootDisk{file: f, dev: dev}
	return nil
}

// openRootDisk opens the image at path for reading and writing, locked
// (flock, exclusive) for as long as it stays open: a second VM on the same
// disk would corrupt its file system.
func openRootDisk(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the root disk: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("the root disk %s is in use by another VM (another helper of this profile is running)", path)
		}
		return nil, fmt.Errorf("locking the root disk %s: %w", path, err)
	}
	return f, nil
}

// close flushes what the guest wrote to the host's disk and releases the
// image; called once the machine has stopped.
func (d *rootDisk) close() error {
	err := d.file.Sync()
	if cerr := d.file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("closing the root disk: %w", err)
	}
	return nil
}
