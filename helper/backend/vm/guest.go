package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/balloon"
	"github.com/cowork-vmm/cowork-vmm/devices/blk"
	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/devices/platform"
	"github.com/cowork-vmm/cowork-vmm/devices/rng"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// guest is one micro-VM. It implements helper.Guest.
type guest struct {
	m          *machine.Machine // nil in tests of the parts that need no VM
	con        *console
	log        *slog.Logger
	kernelFrom string
	// bootTimeout bounds Agent's wait (0: no bound).
	bootTimeout time.Duration
	started     time.Time // when the vCPUs started

	listener net.Listener
	// egress accepts the guest proxy's connections (helper.Guest.Egress).
	egress net.Listener
	// fsKind is the protocol.MountKind of the file-sharing devices
	// (Options.FileSharing): virtio-fs or virtio-9p.
	fsKind string
	// files serves Share's exports (MountTag, uncached); nil until the
	// devices are attached.
	files *ShareDevice
	// sysFiles serves the read-only system directories on a device of
	// their own (SystemMountTag), which the guest caches.
	sysFiles *ShareDevice
	// balloon gives guest memory back to the host (nil: none; balloon.go).
	balloon *balloon.Device
	// disk is the profile's root disk (nil: none; rootdisk.go).
	disk *rootDisk
	// bundle are the disks of the client's bundle the guest boots as its
	// userland (nil: the host's directories; bundleboot.go).
	bundle *bundleDisks

	// restoreFrom is the snapshot a restored machine starts from (closed
	// once started); nil for a cold boot.
	restoreFrom *snapshot.File
	// snapshotPath is the snapshot file a restored guest started from; ""
	// for a cold boot.
	snapshotPath string
	// point is the machine's snapshot point (nil in tests without a VM).
	point *platform.SnapshotPoint
	// suspend is how this boot is suspended (nil: it is not; suspend.go);
	// resumed: it was resumed from a suspended state.
	suspend *suspendPlan
	resumed bool
	// systemExports are the directory exports of sysFiles, by name: what
	// a suspended state shares again.
	systemExports map[string]string

	accepted  chan acceptResult // the agent's connection (capacity 1)
	connected chan struct{}     // closed when the agent has connected

	mu         sync.Mutex
	agentTaken bool
	// descriptors is the helper-wide budget each file-sharing device takes
	// a share of for the host descriptors it holds (Options.Descriptors;
	// nil in tests: a pool of the guest's own).
	descriptors *fdlimit.Pool
	nextExport  int
	err         error

	done     chan struct{} // closed when the VM has ended and err is set
	stopOnce sync.Once
	stopErr  error
}

type acceptResult struct {
	conn net.Conn
	err  error
}

var (
	_ helper.Guest            = (*guest)(nil)
	_ helper.SetupAdjuster    = (*guest)(nil)
	_ helper.SystemSharer     = (*guest)(nil)
	_ helper.ProgressReporter = (*guest)(nil)
	_ helper.ImageUserland    = (*guest)(nil)
)

func newGuestState(con *console, log *slog.Logger, fsKind string) *guest {
	return &guest{
		con: con, log: log, fsKind: fsKind,
		accepted:  make(chan acceptResult, 1),
		connected: make(chan struct{}),
		done:      make(chan struct{}),

		systemExports: make(map[string]string),
	}
}

// attachDevices attaches virtio-vsock (listening on the agent's port), two
// file-sharing devices of kind g.fsKind, virtio-fs or virtio-9p (MountTag
// serving the exports Share registers, SystemMountTag those ShareSystem
// registers, cached), virtio-rng, the balloon (unless devs says none)
// and, when devs has a root disk, the root disk (virtio-blk) to m; with a
// bundle, the bundle's disks instead (the guest owns them once attached).
func (g *guest) attachDevices(m *machine.Machine, devs devices) (err error) {
	rootDisk, bundle := devs.rootDisk, devs.bundle
	g.m = m
	vs, err := vsock.New(vsock.Config{GuestCID: GuestCID, Logger: g.log})
	if err != nil {
		return fmt.Errorf("creating the vsock device: %w", err)
	}
	if _, err := m.AddVirtioMMIO(vs); err != nil {
		return fmt.Errorf("attaching the vsock device: %w", err)
	}
	if g.listener, err = vs.Listen(guesthost.AgentVSockPort); err != nil {
		return fmt.Errorf("listening for the guest agent on vsock port %d: %w", guesthost.AgentVSockPort, err)
	}
	if g.egress, err = vs.Listen(guesthost.EgressVSockPort); err != nil {
		return fmt.Errorf("listening for guest egress on vsock port %d: %w", guesthost.EgressVSockPort, err)
	}
	if g.descriptors == nil {
		g.descriptors = fdlimit.NewPool(0)
	}
	g.descriptors.SetLimit(g.raiseFileLimit())
	if g.files, err = g.attachShareDevice(m, MountTag, false); err != nil {
		return err
	}
	if g.sysFiles, err = g.attachShareDevice(m, SystemMountTag, true); err != nil {
		return err
	}
	if _, err := m.AddVirtioMMIO(rng.New(g.log)); err != nil {
		return fmt.Errorf("attaching the rng device: %w", err)
	}
	if devs.balloon {
		if err := g.attachBalloon(m); err != nil {
			return err
		}
	}
	if bundle != nil {
		if err := bundle.attach(m, g.log); err != nil {
			return err // still the caller's, released after the machine's stop
		}
		g.bundle = bundle
		return nil
	}
	if rootDisk != nil {
		return g.attachRootDisk(m, rootDisk)
	}
	return nil
}

// BootsImage implements helper.ImageUserland: the guest boots the
// client's bundle image.
func (g *guest) BootsImage() bool { return g.bundle != nil }

// attachShareDevice attaches one file-sharing device of kind g.fsKind with
// this tag, serving a fresh set of exports. On error nothing is left to
// release.
func (g *guest) attachShareDevice(m *machine.Machine, tag string, cached bool) (*ShareDevice, error) {
	s, dev, err := NewShareDevice(g.fsKind, tag, cached, g.descriptors.Share(0), g.log)
	if err != nil {
		return nil, err
	}
	if _, err := m.AddVirtioMMIO(dev); err != nil {
		s.Close()
		return nil, fmt.Errorf("attaching the %s device %q: %w", g.fsKind, tag, err)
	}
	return s, nil
}

// raiseFileLimit lifts the helper's open-file limit for the file-sharing
// devices (internal/fdlimit) and returns it; a limit too low for large
// trees is logged.
func (g *guest) raiseFileLimit() uint64 {
	limit, err := fdlimit.Raise()
	if err != nil {
		g.log.Warn("could not raise the open-file limit", "err", err)
	}
	if limit < fdlimit.Low {
		g.log.Warn("the open-file limit is low for file sharing: the devices hold a descriptor per file the guest has looked up, "+
			"so large trees (dpkg's database, git status) may fail with \"Too many open files\"; raise it (ulimit -n, systemd LimitNOFILE=)",
			"limit", limit, "want", fdlimit.Low)
	}
	return limit
}

// Restored implements helper.Restorable: restored from the first-boot
// snapshot, or resumed from a suspended state.
func (g *guest) Restored() bool { return g.snapshotPath != "" || g.resumed }

// DiscardSnapshot implements helper.Restorable: it removes the snapshot
// the guest was restored from (the next start boots cold and takes a new
// one).
func (g *guest) DiscardSnapshot() {
	if g.Restored() {
		removeSnapshot(g.snapshotPath)
	}
}

// start runs the machine: boots the kernel, or goes on from the snapshot.
func (g *guest) start() error {
	if g.restoreFrom == nil {
		return g.m.Start()
	}
	defer g.restoreFrom.Close()
	if err := g.m.StartRestored(); err != nil {
		return err
	}
	if g.disk != nil {
		g.disk.dev.SignalResized() // the snapshot's guest saw the disk's old size
	}
	return nil
}

// run starts the goroutines of a started VM: the agent's accept, the boot
// step reports and the watch for the VM's end.
func (g *guest) run(step func(string, string)) {
	g.started = time.Now()
	step(StepGuestBoot, protocol.StepStarted)
	go g.accept()
	go g.reportSteps(step)
	go g.watch()
}

// accept waits for the agent's one connection.
func (g *guest) accept() {
	conn, err := g.listener.Accept()
	if err == nil {
		// One agent per VM: later dials to the port are refused.
		g.listener.Close()
		close(g.connected)
	}
	g.accepted <- acceptResult{conn, err}
}

// reportSteps reports guest_boot (until the agent writes the boot timer)
// and agent_connect (until it has connected).
func (g *guest) reportSteps(step func(string, string)) {
	select {
	case <-g.m.BootTimerDone():
		step(StepGuestBoot, protocol.StepCompleted)
	case <-g.connected: // the boot timer write was lost; the agent runs
		step(StepGuestBoot, protocol.StepCompleted)
	case <-g.done:
		step(StepGuestBoot, protocol.StepFailed)
		return
	}
	step(StepAgentConnect, protocol.StepStarted)
	select {
	case <-g.connected:
		step(StepAgentConnect, protocol.StepCompleted)
	case <-g.done:
		step(StepAgentConnect, protocol.StepFailed)
	}
}

// watch waits for the VM's end and records why.
func (g *guest) watch() {
	<-g.m.Done()
	exit := g.m.Wait()
	agentConnected := isClosed(g.connected)
	err := exitError(exit, agentConnected, g.con.Panicked(), g.con.Tail())
	if err != nil {
		g.log.Error("VM ended", "exit", exit.Kind.String(), "err", err)
	} else {
		g.log.Info("VM ended", "exit", exit.Kind.String())
	}
	g.mu.Lock()
	g.err = err
	g.mu.Unlock()
	close(g.done)
	g.listener.Close() // a pending Accept returns, after done says why
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// exitError turns the VM's end into Err's value: nil for a stop by the
// host, or for a guest reset or power-off after its agent connected (the
// agent powers off by resetting the machine) without a kernel panic on the
// console; otherwise an error with the reason and the console's last lines.
func exitError(exit vmm.Exit, agentConnected, panicked bool, tail string) error {
	var err error
	switch {
	case exit.Kind == vmm.ExitStopped:
		return nil
	case panicked:
		err = fmt.Errorf("the guest kernel panicked (%s)", exit.Kind)
	case exit.Clean() && agentConnected:
		return nil
	case exit.Clean():
		err = fmt.Errorf("the guest %s before its agent connected (did the guest kernel fail to boot, or /init fail to start?)", exit.Kind)
	default:
		err = fmt.Errorf("the VM failed: %w", exit.AsError())
	}
	if tail != "" {
		err = fmt.Errorf("%w; the guest console's last lines:\n%s", err, tail)
	}
	return err
}

// Progress implements helper.ProgressReporter: the exits of the guest's
// vCPUs (vmm.VM.Exits), which move while it runs.
func (g *guest) Progress() (uint64, bool) {
	if g.m == nil {
		return 0, false
	}
	n, err := g.m.VM().Exits()
	if err != nil {
		g.log.Debug("no vCPU progress to report", "err", err)
		return 0, false
	}
	return n, true
}

// Agent implements helper.Guest: it waits for the agent's vsock connection.
func (g *guest) Agent(ctx context.Context) (io.ReadWriteCloser, error) {
	g.mu.Lock()
	if g.agentTaken {
		g.mu.Unlock()
		return nil, errors.New("kvm backend: the agent connection was already handed out")
	}
	g.agentTaken = true
	g.mu.Unlock()
	var bootTimer <-chan time.Time
	if g.bootTimeout > 0 {
		t := time.NewTimer(time.Until(g.started.Add(g.bootTimeout)))
		defer t.Stop()
		bootTimer = t.C
	}
	select {
	case r := <-g.accepted:
		if r.err != nil {
			select {
			case <-g.done:
				return nil, g.endedBeforeAgent()
			default:
			}
			return nil, fmt.Errorf("kvm backend: waiting for the agent's vsock connection: %w", r.err)
		}
		return r.conn, nil
	case <-g.done:
		return nil, g.endedBeforeAgent()
	case <-ctx.Done():
		return nil, fmt.Errorf("kvm backend: waiting for the guest agent: %w", ctx.Err())
	case <-bootTimer:
		err := fmt.Errorf("kvm backend: the guest agent did not connect within %v of the VM's start", g.bootTimeout)
		if tail := g.con.Tail(); tail != "" {
			return nil, fmt.Errorf("%w; the guest console's last lines:\n%s", err, tail)
		}
		return nil, fmt.Errorf("%w, and the guest printed nothing on its console (the kernel hung early in boot?)", err)
	}
}

func (g *guest) endedBeforeAgent() error {
	err := g.Err()
	if err == nil {
		err = errors.New("the VM was stopped")
	}
	return fmt.Errorf("kvm backend: the VM ended before its agent connected: %w", err)
}

// Share implements helper.Guest: it registers hostPath as an export under
// a fresh attach name and returns it as a source on the uncached device
// (Kind virtiofs, or 9p with COWORK_VMM_FS=9p; Tag MountTag; Aname the
// export; ShareSystem uses the other device). The agent mounts each
// device's root once, keeps it out of the guest's tree (spawned processes
// cannot reach other exports through it) and bind-mounts each export out
// of it: Linux lets a virtio-9p device be mounted only once, and a
// virtio-fs tag has one superblock however often it is mounted.
// A regular file becomes a single-file export (hostfs.Exports.AddFile): a
// directory holding only the file's base name, out of which the agent
// binds the file (Mount.SourceFile); the guest reaches nothing else of
// the file's host directory.
// Read-only is enforced by the host (the export) and again by the agent (a
// read-only bind).
func (g *guest) Share(hostPath string, readOnly bool) (protocol.MountSource, error) {
	return g.share(g.files, MountTag, hostPath, readOnly)
}

// ShareForSession implements helper.SessionSharer: Share, the export
// showing what the helper owns as sessionUID's (uid and gid).
func (g *guest) ShareForSession(hostPath string, readOnly bool, sessionUID uint32) (protocol.MountSource, error) {
	if !protocol.ValidSessionUID(sessionUID) {
		return protocol.MountSource{}, fmt.Errorf("kvm backend: %d is not a session uid", sessionUID)
	}
	return g.share(g.files, MountTag, hostPath, readOnly, hostfs.ShowOwnedAs(hostfs.Owner{UID: sessionUID, GID: sessionUID}))
}

// Unshare implements helper.Guest: it removes the export src names from
// its device, which revokes every file the guest holds in it and closes
// its host descriptors at once. A source of no export of this VM (or one
// already removed) is ignored.
func (g *guest) Unshare(src protocol.MountSource) {
	for _, d := range []*ShareDevice{g.files, g.sysFiles} {
		if d != nil && src.Kind == d.source.Kind && src.Tag == d.source.Tag {
			d.exports.Remove(src.Aname)
		}
	}
}

// ShareSystem implements helper.SystemSharer: it registers hostPath, a
// read-only system directory or an immutable file (the SDK binary), on
// the system device (SystemMountTag), which the guest caches: a cached
// virtio-fs device (long entry and attribute lifetimes, the page cache
// kept across opens), or for 9p a source with cache mode loose. The
// export is read-only on the host side whatever the agent does; a file's
// is pinned to the inode shared (ShareDevice.add), a changed file is
// shared again.
func (g *guest) ShareSystem(hostPath string) (protocol.MountSource, error) {
	return g.share(g.sysFiles, SystemMountTag, hostPath, true)
}

// share registers hostPath on the device d (tag: its tag, for errors)
// under a fresh attach name, unique across both devices, served as opts
// say.
func (g *guest) share(d *ShareDevice, tag, hostPath string, readOnly bool, opts ...hostfs.Option) (protocol.MountSource, error) {
	if !filepath.IsAbs(hostPath) || filepath.Clean(hostPath) != hostPath {
		return protocol.MountSource{}, fmt.Errorf("kvm backend: share path %q must be absolute and clean", hostPath)
	}
	if d == nil {
		return protocol.MountSource{}, fmt.Errorf("kvm backend: this VM has no file-sharing device %q to share host directories through", tag)
	}
	fi, err := os.Stat(hostPath)
	if err != nil {
		return protocol.MountSource{}, fmt.Errorf("kvm backend: sharing %s: %w", hostPath, err)
	}
	g.mu.Lock()
	g.nextExport++
	name := "e" + strconv.Itoa(g.nextExport)
	g.mu.Unlock()
	if err := d.add(name, hostPath, fi.Mode().IsRegular(), readOnly, opts...); err != nil {
		return protocol.MountSource{}, fmt.Errorf("kvm backend: sharing %s: %w", hostPath, err)
	}
	if d == g.sysFiles && fi.IsDir() {
		g.mu.Lock()
		g.systemExports[name] = hostPath
		g.mu.Unlock()
	}
	src := d.source
	src.Aname = name
	return src, nil
}

// AdjustSetup implements helper.SetupAdjuster: the VM's initramfs root is
// already a throwaway root, so the agent mounts the system directories in
// place instead of building a new root.
func (g *guest) AdjustSetup(p *protocol.SetupParams) {
	p.NewRoot = false
	p.ClockUnixNano = time.Now().UnixNano()
	if g.disk != nil {
		p.RootDisk = &protocol.RootDisk{Serial: blk.DefaultSerial}
	}
	if g.bundle != nil {
		p.ImageRoot = g.bundle.imageRoot()
		p.System = nil
	}
}

// Egress implements helper.Guest.Egress: the listener for the guest proxy's
// connections on vsock port guesthost.EgressVSockPort (nil before the
// devices are attached).
func (g *guest) Egress() net.Listener { return g.egress }

// Done implements helper.Guest.
func (g *guest) Done() <-chan struct{} { return g.done }

// Err implements helper.Guest.
func (g *guest) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Stop implements helper.Guest: it ends the VM if it still runs (after the
// agent's shutdown it normally has reset itself already), releases the VM,
// its devices and exports, and closes an agent connection never handed out.
func (g *guest) Stop(ctx context.Context) error {
	g.stopOnce.Do(func() {
		stopped := make(chan error, 1)
		go func() {
			var errs []error
			if g.m != nil {
				if _, err := g.m.Stop(); err != nil {
					errs = append(errs, err)
				}
			}
			if g.listener != nil {
				g.listener.Close()
			}
			if g.egress != nil {
				g.egress.Close()
			}
			for _, d := range []*ShareDevice{g.files, g.sysFiles} {
				if d != nil {
					d.Close() // after the machine's reset
				}
			}
			if g.disk != nil {
				if err := g.disk.close(); err != nil {
					errs = append(errs, err)
				}
			}
			if g.bundle != nil {
				if err := g.bundle.close(); err != nil {
					errs = append(errs, err)
				}
			}
			stopped <- errors.Join(errs...)
		}()
		select {
		case err := <-stopped:
			g.stopErr = err
		case <-ctx.Done():
			g.stopErr = fmt.Errorf("kvm backend: stopping the VM: %w", ctx.Err())
			return
		}
		g.mu.Lock()
		taken := g.agentTaken
		g.mu.Unlock()
		if !taken {
			select {
			case r := <-g.accepted:
				if r.conn != nil {
					r.conn.Close()
				}
			default:
			}
		}
	})
	if g.stopErr != nil {
		return g.stopErr
	}
	return nil
}
