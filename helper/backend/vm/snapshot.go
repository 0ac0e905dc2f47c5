package vm

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/platform"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// Warm starts. A cold boot with Options.SnapshotDir set holds the guest
// agent at the snapshot point (it has started and dialed nothing: no
// session, mount or secret is in the VM yet), writes the VM to a snapshot
// there and lets it go on; later starts of a VM of the same identity (this
// executable, kernel, command line, file-sharing kind, memory, vCPUs)
// restore that snapshot instead of booting. The agent learns it was
// restored and reseeds its random generator; setup steps its clock. A
// snapshot that does not fit or does not check out is removed and the VM
// boots cold (and writes a new one).

// SnapshotEnv set to "off" disables warm starts (Options.SnapshotDir is
// then left empty by the helper).
const SnapshotEnv = "COWORK_VMM_SNAPSHOT"

// DefaultSnapshotDir is where the helper keeps its snapshot:
// $XDG_CACHE_HOME/cowork-vmm/snapshots; "" when SnapshotEnv is "off" or
// there is no cache directory.
func DefaultSnapshotDir() string { return SnapshotDirFor(os.Getenv) }

// SnapshotDirFor is DefaultSnapshotDir with the environment getenv reads
// (doctor's view of the host).
func SnapshotDirFor(getenv func(string) string) string {
	if getenv(SnapshotEnv) == "off" {
		return ""
	}
	base := getenv("XDG_CACHE_HOME")
	if base == "" || !filepath.IsAbs(base) {
		home := getenv("HOME")
		if home == "" {
			return ""
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "cowork-vmm", "snapshots")
}

// Snapshots lists the snapshots in dir (doctor shows them).
func Snapshots(dir string) []string {
	found, _ := filepath.Glob(filepath.Join(dir, "*.snap"))
	return found
}

// snapshotPlan is where the snapshot of one VM identity lives.
type snapshotPlan struct {
	path string
	id   snapshot.Identity
}

// vmIdentity is the snapshot identity of a VM of cfg run by exe on k
// (snapshotIdentity), which both kinds of snapshot start from; nil when
// snapshots are off or it cannot be made (logged: no warm start and no
// suspend).
func (b *Backend) vmIdentity(exe string, k kernel.Image, cfg machine.Config, devs devices) *snapshot.Identity {
	if b.opts.SnapshotDir == "" {
		return nil
	}
	if !vmm.StateSupported {
		b.log.Info("kvm backend: no warm start and no suspend on this architecture: the VMM cannot save a VM's state here yet")
		return nil
	}
	id, err := snapshotIdentity(exe, k, cfg, devs)
	if err != nil {
		b.log.Warn("kvm backend: no warm start and no suspend (cannot identify this VM)", "err", err)
		return nil
	}
	return &id
}

// snapshotPlan returns the first-boot snapshot's plan for a VM of
// identity id (vmIdentity's); nil when there is none.
func (b *Backend) snapshotPlan(id *snapshot.Identity, devs devices) *snapshotPlan {
	if id == nil || devs.bundle != nil {
		// A guest booting the bundle has no first-boot snapshot: it
		// would have to be of the bundle's disks too (it is resumed
		// when it was suspended: suspend.go).
		return nil
	}
	raw, _ := json.Marshal(*id)
	sum := sha256.Sum256(raw)
	return &snapshotPlan{path: filepath.Join(b.opts.SnapshotDir, hex.EncodeToString(sum[:10])+".snap"), id: *id}
}

// snapshotIdentity names what a VM's snapshot depends on: the executable
// (the guest's /init) and kernel, by file identity (path, inode, size,
// modification time) or, for a kernel held in memory, its checksum; the
// command line, boot protocol, file-sharing kind and whether a root disk
// is attached (not which: the guest reads none at the snapshot point);
// memory and vCPUs.
func snapshotIdentity(exe string, k kernel.Image, cfg machine.Config, devs devices) (snapshot.Identity, error) {
	build, err := fileIdentity(exe)
	if err != nil {
		return snapshot.Identity{}, err
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		build = bi.Main.Version + " " + build
	}
	kid := fmt.Sprintf("bytes crc32c=%08x len=%d", crc32.Checksum(k.Bytes, crc32.MakeTable(crc32.Castagnoli)), len(k.Bytes))
	if k.Path != "" {
		if kid, err = fileIdentity(k.Path); err != nil {
			return snapshot.Identity{}, err
		}
	}
	return snapshot.Identity{
		Build:       build,
		Kernel:      fmt.Sprintf("%s cmdline=%q pvh=%v fs=%s disk=%v balloon=%v", kid, cfg.Cmdline, cfg.PVH, devs.fsKind, devs.rootDisk != nil, devs.balloon),
		MemoryBytes: uint64(cfg.MemMiB) << 20,
		CPUs:        cfg.CPUs,
	}, nil
}

// fileIdentity names a file's version without reading it.
func fileIdentity(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	id := fmt.Sprintf("%s size=%d mtime=%d", path, st.Size(), st.ModTime().UnixNano())
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		id += fmt.Sprintf(" dev=%d ino=%d", sys.Dev, sys.Ino)
	}
	return id, nil
}

// createWarm restores a VM of cfg from plan's snapshot, its devices
// attached; nil (boot cold) when there is none or it is unusable (then
// removed, with the reason logged).
func (b *Backend) createWarm(cfg machine.Config, devs devices, plan *snapshotPlan) *guest {
	if plan == nil {
		return nil
	}
	began := time.Now()
	f, err := snapshot.OpenVerified(plan.path, plan.id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		b.log.Info("kvm backend: the snapshot does not fit this VM; booting cold and taking a new one", "reason", err)
		removeSnapshot(plan.path)
		return nil
	}
	checked := time.Now()
	g, err := b.restore(cfg, devs, f)
	if err != nil {
		f.Close()
		b.log.Warn("kvm backend: restoring the snapshot failed; booting cold", "snapshot", plan.path, "err", err)
		removeSnapshot(plan.path)
		return nil
	}
	g.snapshotPath = plan.path
	b.log.Debug("VM restored", "check_snapshot", checked.Sub(began), "restore_and_devices", time.Since(checked))
	return g
}

// restore makes a VM of cfg from the snapshot f, not yet started, with
// its devices attached and a snapshot point that says it was restored;
// f is the guest's to close once started. On error f is still the
// caller's.
func (b *Backend) restore(cfg machine.Config, devs devices, f *snapshot.File) (*guest, error) {
	con := newConsole(b.log, b.opts.Console)
	cfg.Console, cfg.SnapshotPoint = con, platform.NewRestoredSnapshotPoint()
	m, err := machine.Restore(cfg, f)
	if err != nil {
		return nil, err
	}
	g, err := b.attach(m, con, devs)
	if err != nil {
		return nil, err
	}
	g.restoreFrom, g.point = f, cfg.SnapshotPoint
	return g, nil
}

// take waits for the cold-booted guest of m at the snapshot point, writes
// the snapshot, and lets the guest go on. A failure costs only the warm
// start (logged).
func (p *snapshotPlan) take(log *slog.Logger, m *machine.Machine, point *platform.SnapshotPoint) {
	select {
	case <-point.Arrived():
	case <-m.Done():
		return
	}
	err := p.write(m)
	point.Release()
	m.Resume()
	if err != nil {
		log.Warn("kvm backend: no snapshot taken; the next start boots cold too", "err", err)
		return
	}
	log.Info("kvm backend: snapshot taken for warm starts", "path", p.path)
	// Check it now, off the guest's path, so the first warm start need
	// not (OpenVerified records the check).
	if f, err := snapshot.OpenVerified(p.path, p.id); err != nil {
		log.Warn("kvm backend: the snapshot just taken does not check out", "err", err)
		removeSnapshot(p.path)
	} else {
		f.Close()
	}
}

// write snapshots m into a temporary file renamed over plan's path (a
// start never sees half a snapshot), then removes snapshots of other
// identities: one is kept.
func (p *snapshotPlan) write(m *machine.Machine) error {
	dir := filepath.Dir(p.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".snap-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	err = m.Snapshot(f, p.id)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(f.Name(), p.path); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "*.snap"))
	for _, o := range old {
		if o != p.path && strings.HasSuffix(o, ".snap") {
			removeSnapshot(o)
		}
	}
	return nil
}

// removeSnapshot removes a snapshot and what vmm/snapshot keeps beside it.
func removeSnapshot(path string) {
	_ = os.Remove(path)
	_ = os.Remove(path + snapshot.VerifiedSuffix)
}
