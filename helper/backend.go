package helper

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// GuestConfig is what a backend needs to start a guest.
type GuestConfig struct {
	MemoryMiB int
	CPUCount  int
	// StepFunc reports boot progress as startupStep events (status "started"
	// then "completed"); backends call it for their own phases. May be nil.
	StepFunc func(step, status string)
	// RootDisk is the profile's root disk image (rootdisk.go), which a VM
	// attaches as a writable virtio-blk disk and the agent keeps the
	// guest's changes to its root on; "" for none. Backends without
	// disks ignore it.
	RootDisk string
	// Bundle is the client's VM bundle directory (startVM's bundlePath;
	// "" for none). A backend that boots bundles (BundleBooter) makes the
	// bundle's root image the guest's userland when it can, and says why
	// not when it cannot; others ignore it.
	Bundle string
	// ProfileDir is the profile's directory in the helper's data
	// directory, where a backend keeps the profile's writable layer over
	// the bundle's images; "" when the helper keeps no state.
	ProfileDir string
}

// Backend starts guests. The helper never knows whether a guest is a VM or a
// process sandbox: both hand back one connection to the same guest agent.
type Backend interface {
	// Name is "kvm" or "process".
	Name() string
	// Start launches a guest and returns once it is launched (not booted).
	Start(ctx context.Context, cfg GuestConfig) (Guest, error)
}

// Guest is one running guest.
type Guest interface {
	// Agent blocks until the guest agent has connected (or ctx ends, or the
	// guest dies) and returns the channel to it. Called once.
	Agent(ctx context.Context) (io.ReadWriteCloser, error)
	// Share makes a host directory, or a single regular file, available to
	// the guest and returns how the agent mounts it: a bind path (process
	// backend) or a virtio-fs or 9p export (VM). For a file the source is
	// a directory in which the agent finds the file under its base name
	// (protocol.Mount.SourceFile): the VM exports a directory holding that
	// one name and nothing else of the host; the process backend names the
	// file's own directory, from which the agent binds only the file.
	Share(hostPath string, readOnly bool) (protocol.MountSource, error)
	// Unshare withdraws what Share or ShareSystem returned, once nothing is
	// mounted from it any more: the guest can no longer reach it, also
	// through files it still holds open (the VM's files fail with
	// ESTALE), and the host descriptors behind it are released. A no-op
	// where the agent itself confines binds (process backend), or for a
	// source already withdrawn.
	Unshare(src protocol.MountSource)
	// Egress returns the listener of the guest's processes' outbound
	// connections (the process backend's fd-passing socket, the VM's vsock
	// port guesthost.EgressVSockPort); the helper serves each with its
	// egress server, which checks the spawn's allowedDomains, and closes it
	// when the guest ends. Never nil: without it the guest has no way out.
	Egress() net.Listener
	// Done is closed when the guest has ended; Err then says why (nil for a
	// clean stop).
	Done() <-chan struct{}
	Err() error
	// Stop ends the guest (after the agent's shutdown, or forcibly) and frees
	// everything it held. Safe to call more than once.
	Stop(ctx context.Context) error
}

// BackendFactory makes the backend a name selects (COWORK_VMM_BACKEND). It
// is called on every startVM, so a backend that is unusable on this host
// (no /dev/kvm) says so with an actionable error at that moment.
type BackendFactory func() (Backend, error)

// SystemSharer may be implemented by a Guest that shares the host's system
// directories (read-only, and unchanged while the guest runs) apart from
// other directories. The kvm backend serves them from a second virtio-fs
// (or 9p) device whose files the guest caches, so programs start without
// re-reading their binaries and libraries from the host on every exec;
// directories shared with Share stay uncached because the host edits them
// while the guest runs. The helper shares the SDK binary through it too,
// a single regular file that it shares again (and unshares the old) once
// the file changes; the guest may keep the file it got for good, so a
// file's export must serve the file as shared, never what the host puts
// at its path later. Without it the helper uses Share(path, true).
type SystemSharer interface {
	ShareSystem(hostPath string) (protocol.MountSource, error)
}

// SessionSharer may be implemented by a Guest whose shares report their
// files' owners to the guest's kernel (the VM's virtio-fs and 9p devices):
// ShareForSession is Share for a host path mounted in a session, whose
// processes run as sessionUID (protocol.SpawnParams.UID). What the helper
// owns there is shown as sessionUID's, so the session's processes are the
// owners of their own files, as the client's own VM has them; the host
// still enforces the helper's permissions (devices/hostfs.ShowOwnedAs).
// Without it the helper uses Share.
type SessionSharer interface {
	ShareForSession(hostPath string, readOnly bool, sessionUID uint32) (protocol.MountSource, error)
}

// SetupAdjuster may be implemented by a Guest whose agent needs a different
// root filesystem setup than the helper's default: NewRoot true (the agent
// builds a fresh root, as a sandbox on the host must), System listing the
// host's system directories shared read-only. The kvm backend's guests
// turn NewRoot off: the VM's initramfs is already a throwaway root.
type SetupAdjuster interface {
	AdjustSetup(*protocol.SetupParams)
}

// ProgressReporter may be implemented by a Guest that can tell whether it
// still runs: Progress returns a count that moves while the guest executes
// (the vm backend's: its vCPUs' exits, KVM's counters), ok false when it
// cannot tell. The ping loop asks it before declaring a guest whose pings
// time out dead (liveness.go): one whose vCPUs run and whose agent still
// sends frames is busy, not dead.
type ProgressReporter interface {
	Progress() (count uint64, ok bool)
}

// RootDiskAttacher may be implemented by a Backend whose guests attach the
// profile's root disk (GuestConfig.RootDisk): the helper prepares the disk
// (rootdisk.go) only for a backend that says true. The kvm backend does;
// the process backend's guests keep their changes on the host and take
// none.
type RootDiskAttacher interface {
	AttachesRootDisk() bool
}

// BundleBooter may be implemented by a Backend that boots the client's VM
// bundle (GuestConfig.Bundle) as its guests' userland: the kvm backend.
// For other backends the helper logs that the bundle is not booted.
type BundleBooter interface {
	BootsBundles() bool
}

// ImageUserland may be implemented by a Guest whose userland is the
// client's bundle image rather than the host's directories: when it says
// true, the helper shares none of the host's system directories (nor its
// dpkg database) and the guest's AdjustSetup names the image
// (protocol.SetupParams.ImageRoot).
type ImageUserland interface {
	BootsImage() bool
}

// Restorable may be implemented by a Guest that can start from a snapshot
// of an earlier guest instead of booting (the kvm backend's warm start).
// When such a guest ends before its agent is set up, the helper discards
// the snapshot and boots the guest again, cold: the user gets a slower
// start instead of a failed one, and the next start does not restore a
// snapshot that may be bad.
type Restorable interface {
	// Restored says whether the guest started from a snapshot.
	Restored() bool
	// DiscardSnapshot removes the snapshot the guest started from, so the
	// backend's next start boots cold (and takes a new one).
	DiscardSnapshot()
}

// Suspender may be implemented by a Guest that can be saved at stopVM and
// resumed by the next startVM instead of booting (the kvm backend's, with
// virtio-fs and snapshots on). The helper asks PrepareSuspend, then the
// agent (protocol.AgentMethodSuspend), then Suspend; a guest whose
// PrepareSuspend fails, or whose agent refuses, is shut down as ever.
type Suspender interface {
	// PrepareSuspend readies the guest's side before the agent is asked;
	// an error says why this guest cannot be suspended.
	PrepareSuspend() error
	// Suspend waits for the suspended agent, saves the guest and stops
	// it. On error no state is left.
	Suspend(ctx context.Context) (SuspendedState, error)
	// Resumed says the guest was resumed from a suspended state: its
	// agent is sent AgentMethodResume instead of setup.
	Resumed() bool
}

// SuspendedState describes a suspended guest just saved.
type SuspendedState struct {
	Path  string
	Bytes int64         // its size on disk (holes free)
	Took  time.Duration // the save, from the agent's wait to the file checked
}
