package vm

import (
	"fmt"
	"os"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/machine"
)

// rootDisk is the profile's root disk attached to a VM: the image file,
// held open and locked for the VM's life, and its virtio-blk device.
type rootDisk struct {
	file *os.File
	dev  *blk.Device
}

var _ helper.RootDiskAttacher = (*Backend)(nil)

// AttachesRootDisk implements helper.RootDiskAttacher: a VM keeps the
// guest's changes to its root on the profile's root disk.
func (b *Backend) AttachesRootDisk() bool { return true }

// openRootDisk opens the image at path (helper.GuestConfig.RootDisk) for
// the VM, locked against a second VM on it (helper.OpenRootDisk); nil for
// none. A disk that cannot be had (in use by another helper of the
// profile, removed meanwhile) costs the guest its writable root, not its
// start: logged, and the guest boots with its root read-only.
func (b *Backend) openRootDisk(path string) *os.File {
	if path == "" {
		return nil
	}
	f, err := helper.OpenRootDisk(path)
	if err != nil {
		b.log.Warn("kvm backend: the guest starts without a root disk: its root is read-only", "err", err)
		return nil
	}
	return f
}

// attachRootDisk attaches the image file (openRootDisk's) to m as a
// writable virtio-blk disk. The file is the guest's only once attached:
// on error the caller still owns it (a cold boot after a failed restore
// attaches it again).
func (g *guest) attachRootDisk(m *machine.Machine, file *os.File) error {
	dev, err := blk.New(file, blk.Options{Serial: blk.DefaultSerial, Logger: g.log})
	if err != nil {
		return err
	}
	if _, err := m.AddVirtioMMIO(dev); err != nil {
		return fmt.Errorf("attaching the root disk: %w", err)
	}
	g.disk = &rootDisk{file: file, dev: dev}
	return nil
}

// close flushes what the guest wrote to the host's disk and releases the
// image (and its lock); called once the machine has stopped.
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
