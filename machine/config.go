package machine

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/devices/platform"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/loader"
)

// Defaults of Config.
const (
	DefaultMemMiB = 512
	DefaultCPUs   = 1
)

// Config describes a machine.
type Config struct {
	// Kernel is the path of the kernel image (uncompressed vmlinux ELF or
	// bzImage); KernelImage, when set, is the image itself instead.
	Kernel      string
	KernelImage []byte
	// Initrd is the path of an initrd (optional); InitrdImage the bytes;
	// InitrdSource, which wins over both, one streamed into guest memory.
	Initrd       string
	InitrdImage  []byte
	InitrdSource loader.InitrdSource
	// Cmdline is appended to DefaultCmdline (later words override earlier
	// ones), or used alone when NoDefaultCmdline is set. virtio-mmio
	// device entries are always appended.
	Cmdline          string
	NoDefaultCmdline bool
	// PVH enters a vmlinux through its PVH entry point instead of the
	// 64-bit Linux boot protocol.
	PVH bool
	// MemMiB of guest RAM (default 512) and CPUs (default 1).
	MemMiB int
	CPUs   int
	// Console receives the guest's serial output (nil: discarded).
	Console io.Writer
	// Logger receives the VMM's log (nil: slog.Default()).
	Logger *slog.Logger
	// SkipBootProbe skips New's check that this host's KVM can boot Linux
	// (kvm.ProbeHost): for tiny guests that are not Linux, and for callers
	// that probed already.
	SkipBootProbe bool
	// SnapshotPoint, when set, is the snapshot point device the guest
	// agent talks to (guesthost.SnapshotPointPort); nil: none, and the
	// agent goes on at once.
	SnapshotPoint *platform.SnapshotPoint
	// KVMDevice overrides /dev/kvm.
	KVMDevice string
}

// withDefaults fills defaults and checks the sizes.
func (c Config) withDefaults() (Config, error) {
	if c.MemMiB == 0 {
		c.MemMiB = DefaultMemMiB
	}
	if c.CPUs == 0 {
		c.CPUs = DefaultCPUs
	}
	if c.MemMiB < 2 || uint64(c.MemMiB) > (1<<40)>>20 {
		return c, fmt.Errorf("machine: memory of %d MiB: want 2 MiB..1 TiB", c.MemMiB)
	}
	if c.CPUs < 1 || c.CPUs > vmm.MaxVCPUs {
		return c, fmt.Errorf("machine: %d vCPUs: want 1..%d", c.CPUs, vmm.MaxVCPUs)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Console == nil {
		c.Console = io.Discard
	}
	return c, nil
}

// baseCmdline returns the command line before device entries.
func (c Config) baseCmdline() string {
	if c.NoDefaultCmdline {
		return strings.TrimSpace(c.Cmdline)
	}
	return strings.TrimSpace(DefaultCmdline + " " + c.Cmdline)
}

// vmConfig is the VM a machine of c runs on.
func (c Config) vmConfig() vmm.Config {
	return vmm.Config{
		MemoryBytes: uint64(c.MemMiB) << 20,
		CPUs:        c.CPUs,
		Logger:      c.Logger,
		DevicePath:  c.KVMDevice,
	}
}
