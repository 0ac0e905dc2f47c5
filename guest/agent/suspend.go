package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
	"golang.org/x/sys/unix"
)

// Suspend and resume (the VM's; protocol.SuspendParams). At stopVM a host
// that suspends guests asks the agent to suspend instead of shutting
// down: it ends every process, removes every mount but setup's, syncs the
// writable disks and empties their journals, and drops the kernel's
// caches, so that of the host's files the guest keeps only its mount
// roots. Run then returns ErrSuspended; VMMain waits at the snapshot
// point while the VMM saves the VM and ends it. A VM restored from that
// state goes on from the same wait, dials the helper again and runs a new
// Run with the same root (keptState), which the helper resumes
// (protocol.AgentMethodResume) instead of setting up.

// ErrSuspended is returned by Run after a suspend request was served.
var ErrSuspended = errors.New("agent: suspended on request")

// keptState is what outlives one Run in a guest that may be suspended:
// the root its first setup laid out and that setup's result. Safe for
// concurrent use; a nil keptState keeps nothing.
type keptState struct {
	mu  sync.Mutex
	mnt *mounter
	// setup is the first setup's result; nil until it succeeded.
	setup *protocol.SetupResult
	// resumed: this Run is in a guest restored from a suspended state.
	resumed bool
	// dropCaches drops the kernel's caches at a suspend (nil:
	// dropAllCaches; tests count it instead).
	dropCaches func() error
	// woke are a resumed guest's steps from its restore to its dial,
	// reported by resume.
	woke []protocol.TimedStep
	// bootID is the boot id a resumed guest's spawns see ("": the
	// kernel's, which Linux makes once and never renews: every resume of
	// a guest would otherwise share the suspended boot's).
	bootID string
}

// resume marks the state as a resumed guest's.
func (k *keptState) resume() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.resumed = true
}

// newBootID gives the resumed guest's spawns a fresh boot id; call it
// once the generator is reseeded.
func (k *keptState) newBootID() {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40 // version 4, as the kernel's
	b[8] = b[8]&0x3f | 0x80
	k.mu.Lock()
	defer k.mu.Unlock()
	k.bootID = fmt.Sprintf("%x-%x-%x-%x-%x\n", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// wokeUp records a resumed guest's steps up to its dial (nil: none).
func (k *keptState) wokeUp(t *stepTimer) {
	if t == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.woke = t.steps
}

// bootIDBytes is the boot id spawns see in place of the kernel's; nil:
// the kernel's.
func (k *keptState) bootIDBytes() []byte {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.bootID == "" {
		return nil
	}
	return []byte(k.bootID)
}

// mounter returns the kept mounter, made on first use; a fresh one when
// nothing is kept.
func (k *keptState) mounter(log *slog.Logger, isolate bool) *mounter {
	if k == nil {
		return newMounter(log, isolate)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.mnt == nil {
		k.mnt = newMounter(log, isolate)
	}
	return k.mnt
}

// setUp records setup's result, for a resume.
func (k *keptState) setUp(r protocol.SetupResult) {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.setup = &r
}

// handleSuspend readies the guest to be saved (protocol.SuspendParams);
// the server then replies and ends (suspend is a final method). A failure
// leaves the channel open: the helper then shuts the guest down.
func (a *agent) handleSuspend(_ context.Context, raw json.RawMessage) (any, error) {
	if a.opts.keep == nil {
		return nil, errors.New("this agent cannot be suspended: it is not a VM's")
	}
	grace, err := a.graceOf(raw, protocol.AgentMethodSuspend)
	if err != nil {
		return nil, err
	}
	a.log.Info("suspending: ending every process", "grace", grace)
	a.procs.terminateAll(grace)
	a.idle.busy()
	if err := a.mnt.withdrawAllButSystem(); err != nil {
		return nil, fmt.Errorf("suspending: %w", err)
	}
	// The sessions' /tmp starts empty at each start: a resumed guest's
	// is set aside now, before the sync, and removed after the resume.
	if disk := a.mnt.sessionTmpDisk(); disk != "" {
		if err := a.mnt.renewSessionTmp(disk); err != nil {
			a.log.Warn("the sessions' /tmp keeps what they left in it", "err", err)
		}
	}
	if err := a.mnt.syncRootDisk(); err != nil {
		return nil, fmt.Errorf("suspending: syncing the disks: %w", err)
	}
	drop := a.opts.keep.dropCaches
	if drop == nil {
		drop = dropAllCaches
	}
	if err := drop(); err != nil {
		return nil, fmt.Errorf("suspending: dropping the guest's caches: %w", err)
	}
	a.end(ErrSuspended)
	return nil, nil
}

// dropAllCaches drops the clean page cache and the unused dentries and
// inodes (drop_caches 3): a resumed guest must look up again every host
// file it had cached, which may have changed while it was saved. The
// file-sharing devices hear of each inode dropped (FUSE FORGET, 9p clunk).
func dropAllCaches() error {
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

// withdrawAllButSystem removes every mount the agent made after setup
// (sessions' homes and mounts, the SDK), deepest first.
func (m *mounter) withdrawAllButSystem() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var targets []string
	for t := range m.mounts {
		if !slices.Contains(m.system, t) {
			targets = append(targets, t)
		}
	}
	sort.Slice(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	return withRoot(func(root int) error {
		for i, t := range targets {
			err := detach(root, t)
			if err != nil && !(errors.Is(err, unix.ESTALE) && underAnyOf(t, targets[i+1:])) {
				return err
			}
			delete(m.mounts, t)
		}
		return nil
	})
}

// underAnyOf says whether target lies beneath one of dirs. A mount whose
// path went stale (ESTALE: the host removed the export it lies in) cannot
// be reached to unmount, but one beneath a mount withdrawn after it goes
// with that one: a lazy unmount takes the mounts below it along.
func underAnyOf(target string, dirs []string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(target, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// resume answers a resumed guest's AgentMethodResume: the wall clock is
// stepped to the helper's, and the first setup's result is returned with
// this resume's steps.
func (a *agent) resume(p protocol.ResumeParams) (*protocol.SetupResult, error) {
	k := a.opts.keep
	if k == nil {
		return nil, errors.New("this agent was not suspended: set it up instead")
	}
	k.mu.Lock()
	setup, resumed, woke := k.setup, k.resumed, k.woke
	k.mu.Unlock()
	if !resumed || setup == nil {
		return nil, errors.New("this guest was not resumed from a suspended one that was set up: set it up instead")
	}
	timer := newStepTimer()
	timer.steps = append(slices.Clone(woke), protocol.TimedStep{Name: "hello", Micros: a.helloTook.Microseconds()})
	// Every restore of one state starts with the same random state:
	// reseed before anything secret is made.
	if err := a.reseedForResume(p.Seed); err != nil {
		a.log.Warn("agent: resumed, but the random generator could not be reseeded", "err", err)
	}
	k.newBootID()
	timer.done("reseed")
	if p.ClockUnixNano != 0 {
		a.stepClock(time.Unix(0, p.ClockUnixNano))
		timer.done("clock")
	}
	if disk := a.mnt.sessionTmpDisk(); disk != "" {
		go a.mnt.removeStaleTmp(disk) // set aside at the suspend
	}
	result := *setup
	result.Steps = timer.steps
	return &result, nil
}

// reseedForResume reseeds the kernel's generator with the helper's seed
// (protocol.MinResumeSeed to MaxResumeSeed bytes), else from virtio-rng.
func (a *agent) reseedForResume(seed []byte) error {
	if len(seed) >= protocol.MinResumeSeed && len(seed) <= protocol.MaxResumeSeed {
		return reseedWith(seed)
	}
	return reseedFrom("/dev/hwrng", 64)
}

// awaitSave waits at the snapshot point while the VMM saves the suspended
// VM, and says whether this is a VM restored from that state. false: the
// VMM did not hold the guest there (it saved nothing) or let it go on.
func awaitSave(log *slog.Logger) (restored bool) {
	b, err := waitAtPoint()
	if err != nil {
		log.Warn("agent: suspended, but the VMM has no snapshot point", "err", err)
		return false
	}
	return b == guesthost.SnapshotPointRestored
}
