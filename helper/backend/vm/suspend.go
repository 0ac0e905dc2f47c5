package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// Suspend and resume (helper.Suspender). At stopVM the helper asks the
// agent to suspend (protocol.SuspendParams: processes ended, session
// mounts withdrawn, disks synced, caches dropped); the agent then waits
// at the snapshot point, and Suspend saves the VM — vCPUs, devices (the
// virtio-fs devices' node tables by path), RAM sparse — into the
// profile's directory. The next start of the profile restores it when it
// is this VM's and still current, and the agent goes on where it waited,
// with its root set up: no boot and no setup.
//
// A suspended state is current only for the next boot. Every boot of a
// profile bumps the profile's generation (generationFile) and writes it
// durably before its vCPUs run; a state records the generation of the
// boot that wrote it and is restored only while the profile is still at
// that generation. So the state is spent by its restore even if removing
// it fails, and a guest that ran on after it (a cold boot, a helper
// killed with its guest running) makes it stale: it is then removed, and
// the disk, with its journal, is all that counts.
//
// The state also records the identity of the writable disks at the save
// (the root disk, or the bundle's layers: path, size, modification time,
// device, inode): a disk changed since (resized, or written by anything
// else) is not resumed onto. The snapshot's identity
// is the first-boot snapshot's (build, kernel, command line, devices,
// memory, vCPUs) with the state's nonce, so the two files of one state go
// together.

// SuspendEnv set to "off" shuts guests down at stopVM instead of
// suspending them (Options.NoSuspend); SnapshotEnv=off turns both kinds
// of snapshot off.
const SuspendEnv = "COWORK_VMM_SUSPEND"

// Files of a profile's suspended state, in its directory.
const (
	suspendedSnapshot = "suspended.snap"
	suspendedMeta     = "suspended.json"
	generationFile    = "vm-generation"
)

// suspendWait bounds Suspend's wait for the agent at the snapshot point.
const suspendWait = 30 * time.Second

// resumeConnectTimeout bounds a resumed guest's wait for its agent, which
// dials at once (nested emulation: seconds).
const resumeConnectTimeout = time.Minute

// maxSuspendMeta bounds a record read back (a few exports: a few KiB).
const maxSuspendMeta = 1 << 20

// suspendMeta is what a suspended state records beside its snapshot.
type suspendMeta struct {
	// Nonce is also in the snapshot's identity.
	Nonce string `json:"nonce"`
	// Generation is the profile's generation during the boot saved.
	Generation uint64 `json:"generation"`
	// Disks are the writable disks the guest kept its root on (the root
	// disk, or the bundle's layers), and Disk their identity once closed
	// at the save ("" without any).
	Disks []string `json:"disks,omitempty"`
	Disk  string   `json:"disk,omitempty"`
	// SystemExports are the system device's directory exports, by attach
	// name, which the restored device's nodes are found again through.
	SystemExports map[string]string `json:"systemExports"`
	// NextExport is the guest's export counter (names are never reused).
	NextExport int       `json:"nextExport"`
	SavedAt    time.Time `json:"savedAt"`
}

// suspendPlan is how one boot of a profile is suspended and resumed.
type suspendPlan struct {
	dir string // the profile's directory
	// base is the VM's snapshot identity without a state's nonce.
	base snapshot.Identity
	// generation is this boot's (0: unknown, the boot cannot suspend).
	generation uint64
	// candidate is the state found for this boot to resume (nil: none).
	candidate *suspendMeta
	// disks are the paths of the writable disks the guest keeps its root
	// on (the root disk, or the bundle's layers), whose identity a state
	// records once they are closed.
	disks []string
}

// suspendPlan returns the plan for a VM of identity id (vmIdentity's)
// booted for a profile (profileDir); nil, with the reason logged, when
// this VM cannot be suspended: snapshots or suspend off, no identity, no
// profile directory, or 9p (its devices keep no state across a snapshot).
// A guest booting the bundle is identified by its images too.
func (b *Backend) suspendPlan(id *snapshot.Identity, devs devices, profileDir string) *suspendPlan {
	switch {
	case id == nil || b.opts.NoSuspend || profileDir == "":
		return nil
	case devs.fsKind != protocol.MountKindVirtioFS:
		b.log.Info("kvm backend: stopVM will not suspend this guest: its 9p devices keep no state across a snapshot")
		return nil
	}
	base := *id
	if devs.bundle != nil {
		base.Kernel += " bundle=" + devs.bundle.identity()
	}
	return &suspendPlan{dir: profileDir, base: base, disks: devs.writableDisks()}
}

// begin reads the profile's state and generation, then moves the profile
// to this boot's generation, durably, before the VM runs: a state found
// is the candidate to resume only when it was saved at the generation the
// profile was at and the writable disks are as it left them. Every state
// file found is removed (a candidate's snapshot stays readable through
// its open descriptor).
func (p *suspendPlan) begin() error {
	current, err := readGeneration(p.dir)
	if err != nil {
		return err
	}
	meta, metaErr := readSuspendMeta(p.dir)
	if metaErr == nil && meta.Generation == current && meta.Disk == disksIdentity(p.disks) {
		p.candidate = meta
	}
	if err := writeGeneration(p.dir, current+1); err != nil {
		return err
	}
	p.generation = current + 1
	return nil
}

// identity is the snapshot identity of a state with this nonce.
func (p *suspendPlan) identity(nonce string) snapshot.Identity {
	id := p.base
	id.Kernel += " suspended nonce=" + nonce
	return id
}

// discard removes the profile's state files.
func (p *suspendPlan) discard() {
	removeSnapshot(filepath.Join(p.dir, suspendedSnapshot))
	_ = os.Remove(filepath.Join(p.dir, suspendedMeta))
}

// readGeneration returns the profile's generation (0 before its first
// boot that could suspend).
func readGeneration(dir string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(dir, generationFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the profile's %s is damaged: %w", generationFile, err)
	}
	return n, nil
}

// writeGeneration records the profile's generation durably: a temporary
// file synced, renamed over the old one, and the directory synced.
func writeGeneration(dir string, n uint64) error {
	return writeDurably(dir, generationFile, []byte(strconv.FormatUint(n, 10)+"\n"))
}

// writeDurably replaces dir/name with data: written to a temporary file,
// synced, renamed, and the directory synced. Mode 0600.
func writeDurably(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readSuspendMeta reads the profile's suspended state's record.
func readSuspendMeta(dir string) (*suspendMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, suspendedMeta))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSuspendMeta {
		return nil, fmt.Errorf("%s is damaged: %d bytes", suspendedMeta, len(b))
	}
	var m suspendMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s is damaged: %w", suspendedMeta, err)
	}
	return &m, nil
}

// disksIdentity names the version of each disk at paths (fileIdentity):
// "" for none.
func disksIdentity(paths []string) string {
	var ids []string
	for _, p := range paths {
		id, err := fileIdentity(p)
		if err != nil {
			id = p + " unknown: " + err.Error()
		}
		ids = append(ids, id)
	}
	return strings.Join(ids, "; ")
}

// resume restores the VM of cfg from the plan's candidate state, its
// devices attached and the system exports registered again under their
// names; nil (boot cold) when there is none or it does not fit (logged).
// The state's files are gone either way (begin's generation spent it).
func (b *Backend) resume(cfg machine.Config, devs devices, p *suspendPlan) *guest {
	meta := p.candidate
	if meta == nil {
		p.discard()
		return nil
	}
	path := filepath.Join(p.dir, suspendedSnapshot)
	f, err := snapshot.OpenVerified(path, p.identity(meta.Nonce))
	p.discard()
	if err != nil {
		b.log.Info("kvm backend: the suspended guest does not fit this VM; booting", "reason", err)
		return nil
	}
	g, err := b.restore(cfg, devs, f)
	if err != nil {
		f.Close()
		b.log.Warn("kvm backend: restoring the suspended guest failed; booting", "err", err)
		return nil
	}
	if err := g.restoreExports(meta); err != nil {
		g.restoreFrom = nil
		g.disk = nil // still the caller's, for the boot
		_ = g.Stop(context.Background())
		f.Close()
		b.log.Warn("kvm backend: the suspended guest's shares cannot be had again; booting", "err", err)
		return nil
	}
	g.resumed, g.suspend = true, p
	// It boots nothing: one that has not dialed by then will not, and
	// the helper boots it instead.
	g.bootTimeout = min(g.bootTimeout, resumeConnectTimeout)
	return g
}

// restoreExports registers the state's system exports again, under their
// names, before the devices' state is restored (StartRestored), and
// carries the export counter on.
func (g *guest) restoreExports(meta *suspendMeta) error {
	for name, hostPath := range meta.SystemExports {
		if err := g.sysFiles.add(name, hostPath, false, true); err != nil {
			return fmt.Errorf("sharing %s again: %w", hostPath, err)
		}
		g.systemExports[name] = hostPath
	}
	g.nextExport = meta.NextExport
	return nil
}

var _ helper.Suspender = (*guest)(nil)

// PrepareSuspend implements helper.Suspender: it makes the snapshot
// point hold the agent's next arrival.
func (g *guest) PrepareSuspend() error {
	if g.suspend == nil || g.suspend.generation == 0 || g.point == nil {
		return errors.New("kvm backend: this guest cannot be suspended (snapshots or suspend off, 9p, or no profile directory)")
	}
	g.point.Hold()
	return nil
}

// Suspend implements helper.Suspender: it waits for the suspended agent
// at the snapshot point, saves the VM into the profile's directory and
// stops it. On error nothing is left of the state (the guest is stopped
// by the helper all the same).
func (g *guest) Suspend(ctx context.Context) (helper.SuspendedState, error) {
	p := g.suspend
	if p == nil || g.point == nil {
		return helper.SuspendedState{}, errors.New("kvm backend: PrepareSuspend was not called")
	}
	wait := time.NewTimer(suspendWait)
	defer wait.Stop()
	select {
	case <-g.point.Arrived():
	case <-g.done:
		return helper.SuspendedState{}, errors.New("kvm backend: the VM ended before its agent was ready to be saved")
	case <-ctx.Done():
		return helper.SuspendedState{}, ctx.Err()
	case <-wait.C:
		return helper.SuspendedState{}, fmt.Errorf("kvm backend: the agent did not wait to be saved within %v", suspendWait)
	}
	began := time.Now()
	size, err := g.writeSuspended(p)
	if err != nil {
		p.discard()
		return helper.SuspendedState{}, err
	}
	return helper.SuspendedState{Path: filepath.Join(p.dir, suspendedSnapshot), Bytes: size, Took: time.Since(began)}, nil
}

// writeSuspended writes the paused VM's snapshot, marked as written whole
// (the resume does not read it all to check it), stops the VM, then
// writes the record. It returns the snapshot's size on disk.
func (g *guest) writeSuspended(p *suspendPlan) (int64, error) {
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	meta := suspendMeta{Nonce: hex.EncodeToString(nonce), Generation: p.generation, SavedAt: time.Now().UTC()}
	path := filepath.Join(p.dir, suspendedSnapshot)
	f, err := os.CreateTemp(p.dir, ".suspended-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	began := time.Now()
	err = g.m.Snapshot(f, p.identity(meta.Nonce)) // pauses the VM
	written := time.Now()
	if err == nil {
		err = f.Sync()
	}
	synced := time.Now()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("kvm backend: saving the suspended guest: %w", err)
	}
	g.mu.Lock()
	meta.SystemExports, meta.NextExport = maps.Clone(g.systemExports), g.nextExport
	g.mu.Unlock()
	if err := os.Rename(f.Name(), path); err != nil {
		return 0, err
	}
	if err := snapshot.MarkWritten(path); err != nil {
		return 0, err
	}
	checked := time.Now()
	// The disks are what they will be once closed (a layer commits its
	// map then): the record, written last, names them so.
	if err := g.Stop(context.Background()); err != nil {
		return 0, err
	}
	meta.Disks, meta.Disk = p.disks, disksIdentity(p.disks)
	raw, _ := json.Marshal(meta)
	if err := writeDurably(p.dir, suspendedMeta, raw); err != nil {
		return 0, err
	}
	g.log.Info("suspended guest saved", "write", written.Sub(began).Round(time.Millisecond),
		"sync", synced.Sub(written).Round(time.Millisecond), "place", checked.Sub(synced).Round(time.Millisecond),
		"record", time.Since(checked).Round(time.Millisecond))
	return allocatedBytes(path), nil
}

// allocatedBytes is the disk space a file takes (holes free).
func allocatedBytes(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return st.Size()
}

// Resumed implements helper.Suspender.
func (g *guest) Resumed() bool { return g.resumed }

// SuspendedState describes a profile's suspended guest for doctor.
type SuspendedState struct {
	Profile string    // the profile's directory name
	Bytes   int64     // the snapshot's size on disk
	SavedAt time.Time // when it was saved
	// Unusable says why the next start would not resume it ("": it
	// would, if the build, kernel, memory and vCPUs are the same).
	Unusable string
}

// SuspendedStates lists the suspended guests of the profiles in
// profilesDir (the helper's data directory's profiles/).
func SuspendedStates(profilesDir string) []SuspendedState {
	metas, _ := filepath.Glob(filepath.Join(profilesDir, "*", suspendedMeta))
	var out []SuspendedState
	for _, m := range metas {
		dir := filepath.Dir(m)
		s := SuspendedState{Profile: filepath.Base(dir), Bytes: allocatedBytes(filepath.Join(dir, suspendedSnapshot))}
		meta, err := readSuspendMeta(dir)
		gen, genErr := readGeneration(dir)
		switch {
		case err != nil:
			s.Unusable = err.Error()
		case genErr != nil:
			s.Unusable = genErr.Error()
		case s.Bytes == 0:
			s.Unusable = "its snapshot is missing"
		case meta.Generation != gen:
			s.Unusable = "the profile's guest ran after it was saved (a stale state: the next start removes it)"
		default:
			s.SavedAt = meta.SavedAt
			s.Unusable = diskChanged(meta)
		}
		out = append(out, s)
	}
	return out
}

// diskChanged says whether the disks a state was saved with changed
// since ("": no).
func diskChanged(meta *suspendMeta) string {
	if disksIdentity(meta.Disks) != meta.Disk {
		return "its disks changed since it was saved"
	}
	return ""
}
