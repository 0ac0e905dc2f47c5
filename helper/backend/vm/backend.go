package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/platform"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/loader"
)

// Name is the backend's name (helper.BackendKVM).
const Name = helper.BackendKVM

// GuestCID is the guest's vsock context id (the host is CID 2).
const GuestCID = 3

// MountTag is the tag of the file-sharing device (virtio-fs, or virtio-9p
// with COWORK_VMM_FS=9p) every session and user export is reached
// through; the attach name (aname) selects the export.
const MountTag = "cowork"

// SystemMountTag is the tag of the second file-sharing device, which
// serves only the host's read-only system directories and immutable files
// such as the SDK binary (Guest.ShareSystem). The guest caches its files (a virtio-fs device
// created Cached; for 9p, the agent mounts it with
// protocol.NinePCacheLoose): those files do not change while a guest runs,
// and without a cache every exec would re-read its binary and libraries
// from the host. MountTag stays uncached because the host edits session
// and mounted directories while the guest works in them. Two devices are
// needed because caching belongs to the device (virtio-fs) or to the
// mount of a device Linux mounts only once (9p).
const SystemMountTag = "cowork-sys"

// Startup steps the backend reports through GuestConfig.StepFunc, in order.
// Each is "started" then "completed" ("failed" when the guest died first).
const (
	StepCreateVM     = "vm_create"     // kernel located, initramfs built, VM and devices created
	StepLoadKernel   = "kernel_load"   // kernel and initramfs in guest memory, vCPUs started
	StepGuestBoot    = "guest_boot"    // the guest kernel boots until the agent writes the boot timer
	StepAgentConnect = "agent_connect" // the agent dials the helper over vsock
)

// DefaultBootTimeout bounds how long Guest.Agent waits for the agent to
// connect: a guest kernel that hangs at boot becomes an error with its
// console's last lines instead of a guest that never connects. A real KVM
// host boots in about a second; nested emulation takes tens of seconds.
const DefaultBootTimeout = 3 * time.Minute

// fallbackHint ends every "this host cannot run the VM" error.
const fallbackHint = "set COWORK_VMM_BACKEND=process to run guests as sandboxed host processes instead (no VM isolation)"

// Options configure the backend. The zero value finds everything itself.
type Options struct {
	// Kernel overrides the guest kernel (a vmlinux path); empty means
	// $COWORK_VMM_KERNEL, then the embedded kernel, then one beside the
	// executable, then the build cache.
	Kernel string
	// Executable is the binary put in the initramfs as /init; default
	// os.Executable(). It must be a static build of cowork-vmm
	// (CGO_ENABLED=0): it runs the agent when it is PID 1.
	Executable string
	// CompressInitramfs gzips the initramfs (see buildGzipInitramfs).
	CompressInitramfs bool
	// Cmdline is appended to the machine's kernel command line.
	Cmdline string
	// GuestDebug turns on the agent's debug log (cowork.debug on the
	// kernel command line); the log goes to the serial console.
	GuestDebug bool
	// PVH enters the kernel through its PVH entry point instead of the
	// 64-bit Linux boot protocol.
	PVH bool
	// Console, when set, also receives every line of the guest's serial
	// console (the agent logs its warnings there, everything with
	// GuestDebug; the kernel is quiet unless it fails), as the process
	// backend's agent log goes to its Stderr.
	Console io.Writer
	// BootTimeout: see DefaultBootTimeout.
	BootTimeout time.Duration
	// KVMDevice overrides /dev/kvm.
	KVMDevice string
	// FileSharing selects the device type of the host shares:
	// FileSharingVirtioFS (also when empty) or FileSharingNineP
	// ($COWORK_VMM_FS, FSEnv). Another value makes Start fail.
	FileSharing string
	// Logger receives the backend's log and, at debug level, the guest's
	// console; nil discards.
	Logger *slog.Logger
	// Descriptors is the helper-wide descriptor budget every file-sharing
	// device of every VM takes a share of (internal/fdlimit): one per
	// helper process, however many backends it makes (one per VM). nil:
	// the backend makes one of its own.
	Descriptors *fdlimit.Pool
	// SnapshotDir, when set, is where the backend keeps the snapshot it
	// restores for warm starts (snapshot.go; the helper uses
	// DefaultSnapshotDir); empty: every start boots cold.
	SnapshotDir string
	// NoSuspend shuts guests down at stopVM instead of suspending them
	// (SuspendEnv=off; suspend.go); warm starts from the first-boot
	// snapshot stay.
	NoSuspend bool
	// NoBalloon attaches no virtio-balloon (BalloonEnv=off; balloon.go):
	// the guest's freed memory then stays with it until it stops.
	NoBalloon bool
}

// Backend starts micro-VM guests. It implements helper.Backend.
type Backend struct {
	opts Options
	log  *slog.Logger

	// Host facts, replaceable in tests.
	probe      func(device string) kvm.HostProbe
	hostLimits func() hostLimits
	kernels    func(executable string) kernel.Sources
}

var _ helper.Backend = (*Backend)(nil)

// New returns the kvm backend. It does not touch KVM: Start checks the host.
func New(opts Options) *Backend {
	if opts.BootTimeout <= 0 {
		opts.BootTimeout = DefaultBootTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Descriptors == nil {
		opts.Descriptors = fdlimit.NewPool(0)
	}
	return &Backend{
		opts:       opts,
		log:        log,
		probe:      kvm.ProbeHost,
		hostLimits: currentHostLimits,
		kernels:    func(exe string) kernel.Sources { return defaultKernelSources(opts.Kernel, exe) },
	}
}

// Name implements helper.Backend.
func (b *Backend) Name() string { return Name }

// Start implements helper.Backend: it checks that this host's KVM can boot
// Linux, locates the kernel, builds the initramfs, creates the VM with its
// devices and starts it. It returns once the vCPUs run; boot progress is
// reported through cfg.StepFunc and Guest.Agent waits for the agent.
func (b *Backend) Start(ctx context.Context, cfg helper.GuestConfig) (helper.Guest, error) {
	step := cfg.StepFunc
	if step == nil {
		step = func(string, string) {}
	}
	began := time.Now()
	fsKind, err := FileSharingKind(b.opts.FileSharing)
	if err != nil {
		return nil, err
	}
	if err := b.preflight(); err != nil {
		return nil, err
	}
	b.log.Debug("preflight", "took", time.Since(began))
	memMiB, cpus, err := sizing(cfg.MemoryMiB, cfg.CPUCount, b.hostLimits())
	if err != nil {
		return nil, err
	}
	step(StepCreateVM, protocol.StepStarted)
	g, err := b.create(memMiB, cpus, fsKind, cfg)
	if err != nil {
		step(StepCreateVM, protocol.StepFailed)
		return nil, err
	}
	step(StepCreateVM, protocol.StepCompleted)
	if err := ctx.Err(); err != nil {
		_ = g.Stop(context.Background())
		return nil, fmt.Errorf("kvm backend: start cancelled: %w", err)
	}
	step(StepLoadKernel, protocol.StepStarted)
	loadStart := time.Now()
	if g, err = b.startOrBoot(g, memMiB, cpus, fsKind, cfg); err != nil {
		step(StepLoadKernel, protocol.StepFailed)
		return nil, err
	}
	step(StepLoadKernel, protocol.StepCompleted)
	b.log.Debug("kernel and initramfs loaded, vCPUs started", "took", time.Since(loadStart))
	g.run(step)
	b.log.Info("VM started", "memoryMiB", memMiB, "cpus", cpus, "kernel", g.kernelFrom, "fileSharing", fsKind,
		"interruptController", g.m.VM().InterruptController())
	return g, nil
}

// startOrBoot starts g; a resumed guest that cannot go on is stopped and
// the VM created again (its state is spent already, so it boots, or
// restores the first-boot snapshot) and started. On error nothing is
// left running.
func (b *Backend) startOrBoot(g *guest, memMiB, cpus int, fsKind string, cfg helper.GuestConfig) (*guest, error) {
	err := g.start()
	if err != nil && g.resumed {
		b.log.Warn("kvm backend: the suspended guest could not go on; booting", "err", err)
		_ = g.Stop(context.Background())
		if g, err = b.create(memMiB, cpus, fsKind, cfg); err != nil {
			return nil, err
		}
		err = g.start()
	}
	if err != nil {
		_ = g.Stop(context.Background())
		return nil, fmt.Errorf("kvm backend: booting the guest kernel (%s): %w", g.kernelFrom, err)
	}
	return g, nil
}

// preflight refuses hosts whose KVM cannot boot Linux, before any work,
// with the probe doctor uses.
func (b *Backend) preflight() error {
	p := b.probe(b.opts.KVMDevice)
	if err := p.BootsLinux(); err != nil {
		hint := fallbackHint
		if p.PVM {
			hint = "use a host with hardware virtualisation (VT-x/AMD-V, or nested virtualisation enabled), or " + fallbackHint
		}
		return fmt.Errorf("kvm backend: %w; %s", err, hint)
	}
	return nil
}

// create locates the kernel and assembles the VM with its devices (file
// sharing of kind fsKind, the root disk at rootDisk when it can be had),
// not yet running: restored from the backend's snapshot when it has a
// sound one for this VM (warm), else with the initramfs built to boot
// cold, taking the snapshot on the way when snapshots are on.
func (b *Backend) create(memMiB, cpus int, fsKind string, gc helper.GuestConfig) (g *guest, err error) {
	// Opened once, before the snapshot is chosen: the snapshot is of the
	// devices the VM really gets, and a disk in use costs no warm start.
	// A guest booting the bundle needs no root disk: the bundle's layer
	// keeps its changes.
	devs := devices{fsKind: fsKind, bundle: b.openBundle(gc.Bundle, gc.ProfileDir), balloon: !b.opts.NoBalloon}
	if devs.bundle == nil {
		devs.rootDisk = b.openRootDisk(gc.RootDisk)
	}
	defer func() {
		if err != nil && devs.rootDisk != nil {
			devs.rootDisk.Close() // not attached: still ours
		}
		if err != nil && devs.bundle != nil {
			_ = devs.bundle.close()
		}
	}()
	exe := b.opts.Executable
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("kvm backend: finding the helper's own executable (the guest's /init): %w", err)
		}
	}
	began := time.Now()
	k, err := kernel.Locate(b.kernels(exe))
	if err != nil {
		return nil, fmt.Errorf("kvm backend: %w", err)
	}
	cmdline := b.opts.Cmdline
	if b.opts.GuestDebug {
		cmdline += " " + guesthost.DebugCmdlineFlag
	}
	if devs.balloon {
		cmdline += " " + balloonCmdline
	}
	cfg := machine.Config{
		Kernel: k.Path, KernelImage: k.Bytes, Cmdline: cmdline, PVH: b.opts.PVH,
		MemMiB: memMiB, CPUs: cpus, Logger: b.log, KVMDevice: b.opts.KVMDevice,
		// preflight probed this host already.
		SkipBootProbe: true,
	}
	id := b.vmIdentity(exe, k, cfg, devs)
	snap := b.snapshotPlan(id, devs)
	sus := b.suspendPlan(id, devs, gc.ProfileDir)
	if sus != nil {
		if err := sus.begin(); err != nil {
			b.log.Warn("kvm backend: stopVM will not suspend this guest (the profile's generation cannot be kept)", "err", err)
			sus = nil
		} else if g := b.resume(cfg, devs, sus); g != nil {
			g.kernelFrom = k.From + ", resumed from the profile's suspended guest"
			return g, nil
		}
	}
	if g := b.createWarm(cfg, devs, snap); g != nil {
		g.kernelFrom = k.From + ", restored from the snapshot " + snap.path
		g.suspend = sus
		return g, nil
	}
	located := time.Now()
	if cfg.InitrdSource, err = b.initramfs(exe); err != nil {
		return nil, err
	}
	sized := time.Now()
	// Every VM has the point: a suspend holds the agent there too.
	cfg.SnapshotPoint = platform.NewSnapshotPoint(snap != nil)
	con := newConsole(b.log, b.opts.Console)
	cfg.Console = con
	m, err := machine.New(cfg)
	if err != nil {
		return nil, machineError(err)
	}
	made := time.Now()
	g, err = b.attach(m, con, devs)
	if err != nil {
		return nil, err
	}
	g.point, g.suspend = cfg.SnapshotPoint, sus
	if snap != nil {
		go snap.take(b.log, m, cfg.SnapshotPoint)
	}
	b.log.Debug("VM created", "locate_kernel", located.Sub(began), "initramfs", sized.Sub(located),
		"vm", made.Sub(sized), "devices", time.Since(made))
	g.kernelFrom = k.From
	return g, nil
}

// initramfs returns the guest's initramfs: the executable as /init.
func (b *Backend) initramfs(exe string) (loader.InitrdSource, error) {
	if b.opts.CompressInitramfs {
		gz, err := buildGzipInitramfs(exe)
		if err != nil {
			return nil, fmt.Errorf("kvm backend: %w", err)
		}
		return loader.InitrdBytes(gz), nil
	}
	src, err := newInitramfsSource(exe)
	if err != nil {
		return nil, fmt.Errorf("kvm backend: %w", err)
	}
	return src, nil
}

// devices are what a VM has attached besides its fixed set: the kind of
// its file-sharing devices and its root disk, open and locked (nil for
// none). A snapshot is of one such set (snapshotIdentity).
type devices struct {
	fsKind   string
	rootDisk *os.File
	// bundle are the disks of the client's bundle when the guest boots it
	// (bundleboot.go); never with a root disk, never snapshotted.
	bundle *bundleDisks
	// balloon attaches the virtio-balloon (not Options.NoBalloon).
	balloon bool
}

// writableDisks are the paths of the files the guest keeps its root on:
// the root disk, or the bundle's layers.
func (devs devices) writableDisks() []string {
	if devs.bundle != nil {
		return devs.bundle.layerPaths()
	}
	if devs.rootDisk != nil {
		return []string{devs.rootDisk.Name()}
	}
	return nil
}

// attach gives the new machine m its guest and devices.
func (b *Backend) attach(m *machine.Machine, con *console, devs devices) (*guest, error) {
	g := newGuestState(con, b.log, devs.fsKind)
	g.bootTimeout = b.opts.BootTimeout
	g.descriptors = b.opts.Descriptors
	if err := g.attachDevices(m, devs); err != nil {
		_ = g.Stop(context.Background())
		return nil, fmt.Errorf("kvm backend: %w", err)
	}
	return g, nil
}

// machineError is machine.New's or Restore's error for the user.
func machineError(err error) error {
	if errors.Is(err, kvm.ErrNoKVM) || errors.Is(err, kvm.ErrKVMPermission) {
		return fmt.Errorf("kvm backend: %w; or %s", err, fallbackHint)
	}
	return fmt.Errorf("kvm backend: creating the VM: %w", err)
}
