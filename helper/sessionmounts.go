package helper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// sessionMounts owns what the helper has mounted in one guest: the mount
// table, the sessions' uses, and the releases oneShot processes' ends
// start. Every mount the helper makes in the guest after its setup (a
// session's home and what lies below it, the SDK, the run subcommand's
// --mount) goes through it.
//
// A target's record goes through three states:
//
//	(none) ──mount──▶ mounted ──withdraw──▶ withdrawn ──remount──▶ mounted
//	                     │                      │
//	                     └───────forget─────────┴──▶ forgotten (no record)
//
// What they mean:
//   - mounted: the host path is shared with the guest (Guest.Share, or for
//     an immutable file such as the SDK SystemSharer.ShareSystem) and the
//     agent has mounted it at the target. Mounting the same thing again is
//     nothing; mounting something else there replaces it, and what was
//     there is unshared even if the agent failed (it unmounts the old
//     mount first): a target remounted read-only must not stay writable.
//   - withdrawn: the share is withdrawn (Guest.Unshare), so the guest has no
//     way into the host path any more; the record keeps what was asked for,
//     so that a resume or a readFile can mount it again (remount).
//   - forgotten: no record; the next spawn mounts afresh.
//
// Which of a session's targets change, and when, the session's events say
// (the spawn flags are in spawn.go):
//   - idle: no process of the session runs and no call uses it (its last
//     process ended, a spawn failed, a readFile is done): every mounted
//     target is withdrawn.
//   - retire: a fresh start (no isResume) that is the session's only use:
//     its spawn mounts but the spawn's own are unmounted and withdrawn.
//   - release: a oneShot process's end, when the session is then idle:
//     every target, the home's too, is unmounted and forgotten.
//   - forget: the session's directory was deleted: every target is
//     forgotten (unshared), whatever runs.
//   - remount: a resume (its withdrawn spawn mounts) or a readFile (the
//     withdrawn targets that lead to the path it reads), outer first.
//
// Uses: a call that needs a session's mounts before a process of its own
// runs in them (a spawn until its process is registered, a readFile) holds
// a use (prepare, prepareRead), which keeps idle and retire from taking
// them away meanwhile. A spawn asks once: prepare waits for a release of
// the session still in progress, takes a use and mounts what the spawn
// asks; the lease it returns ends the use.
//
// Locks: mu guards the table and the uses and is held across the guest
// calls that change a target (so two spawns of a session do not mount its
// home twice); a session's processes are read from the Service under it
// (Service.mu is a leaf: nothing calls in here holding it). oneShotMu
// guards the oneShot processes and releases, is never held with mu, and is
// what the agent's read loop takes (exited): mu may be held while the
// agent's reply is awaited on that loop.
type sessionMounts struct {
	guest mountGuest

	mu       sync.Mutex
	byTarget map[string]mountRecord
	uses     map[string]int

	oneShotMu sync.Mutex
	oneShots  map[*process]bool
	// releasing holds, per session, a channel closed when the release a
	// oneShot process's end started is done: a spawn of that session
	// waits for it, so a client that spawns again on seeing the exit
	// never finds the released mounts still there.
	releasing map[string]chan struct{}
}

// mountGuest is what sessionMounts needs of its guest and its Service
// (guestInstance, in mounts.go).
type mountGuest interface {
	// share shares host for a mount in session's home ("": outside any).
	share(host string, readOnly bool, session string) (protocol.MountSource, error)
	// shareImmutable shares a read-only file that never changes while
	// shared (the SDK binary) where the guest may cache it for good.
	shareImmutable(host string) (protocol.MountSource, error)
	unshare(protocol.MountSource)
	mountInGuest(protocol.Mount) error
	unmountInGuest(target string) error
	// sessionRuns says whether a process of the session runs.
	sessionRuns(session string) bool
	// mounted is told of every target mounted.
	mounted(target string)
	// vmEnded is closed when the guest has ended.
	vmEnded() <-chan struct{}
	logger() *slog.Logger
}

// mountKey is what was asked for at a target.
type mountKey struct {
	host     string
	file     string // a single file, shared as itself: its name
	readOnly bool
	// immutable: a read-only file shared with shareImmutable, as the
	// file id names it; the same path with another id is another file.
	immutable bool
	id        fileID
}

// fileID tells one content of a host file from another without reading
// it: another inode (a file renamed over it), or the same one rewritten
// (its size or mtime moved).
type fileID struct {
	dev, ino uint64
	size     int64
	mtimeNs  int64
}

// mountRecord is a target's record: what was asked for (key), and the
// source the guest got for it, zero once withdrawn.
type mountRecord struct {
	key       mountKey
	src       protocol.MountSource
	withdrawn bool
}

// mount makes a host path visible at a guest target (the mounted state),
// unless the same thing is mounted there already. A single file is shared
// as itself, never as its directory.
func (m *sessionMounts) mount(host, target string, readOnly bool) error {
	key, err := mountKeyOf(host, readOnly)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mountLocked(target, key)
}

// mountImmutable mounts the regular file host read-only at a guest
// target through shareImmutable (the mounted state), unless the same file,
// unchanged, is mounted there already: a file changed since (fileID) is
// shared afresh and the old share withdrawn, so the guest never keeps the
// old file's cached pages for the new one.
func (m *sessionMounts) mountImmutable(host, target string) error {
	key, err := immutableKeyOf(host)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mountLocked(target, key)
}

// immutableKeyOf is the key of an immutable mount of host, a regular file.
func immutableKeyOf(host string) (mountKey, error) {
	fi, err := os.Stat(host)
	if err != nil {
		return mountKey{}, fmt.Errorf("mount source: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !ok {
		return mountKey{}, fmt.Errorf("mount source %s is not a regular file", host)
	}
	id := fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtimeNs: st.Mtim.Nano()}
	return mountKey{host: host, file: filepath.Base(host), readOnly: true, immutable: true, id: id}, nil
}

// mountKeyOf is the key of a mount of host: a directory, or a single file.
func mountKeyOf(host string, readOnly bool) (mountKey, error) {
	fi, err := os.Stat(host)
	if err != nil {
		return mountKey{}, fmt.Errorf("mount source: %w", err)
	}
	key := mountKey{host: host, readOnly: readOnly}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return mountKey{}, fmt.Errorf("mount source %s is neither a directory nor a regular file", host)
		}
		key.file = filepath.Base(host)
	}
	return key, nil
}

// mountLocked is mount of key at target; the caller holds mu.
func (m *sessionMounts) mountLocked(target string, key mountKey) error {
	old, had := m.byTarget[target]
	if had && old.key == key && !old.withdrawn {
		return nil
	}
	var src protocol.MountSource
	var err error
	if key.immutable {
		src, err = m.guest.shareImmutable(key.host)
	} else {
		session, _, _ := sessionOfTarget(target)
		src, err = m.guest.share(key.host, key.readOnly, session)
	}
	if err != nil {
		return fmt.Errorf("sharing %s with the guest: %w", key.host, err)
	}
	err = m.guest.mountInGuest(protocol.Mount{Source: src, Target: target, ReadOnly: key.readOnly, SourceFile: key.file})
	if had {
		m.drop(target, false)
	}
	if err != nil {
		m.guest.unshare(src)
		return err
	}
	if m.byTarget == nil {
		m.byTarget = make(map[string]mountRecord)
	}
	m.byTarget[target] = mountRecord{key: key, src: src}
	m.guest.mounted(target)
	return nil
}

// drop withdraws target's share if it is mounted and forgets its record,
// or keeps it withdrawn. The caller holds mu.
func (m *sessionMounts) drop(target string, keep bool) {
	r := m.byTarget[target]
	if !r.withdrawn {
		m.guest.unshare(r.src)
	}
	if keep {
		m.byTarget[target] = mountRecord{key: r.key, withdrawn: true}
	} else {
		delete(m.byTarget, target)
	}
}

// has says whether anything of a session is mounted, or withdrawn since.
func (m *sessionMounts) has(session string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.inSession(session, anyTarget)) > 0
}

// anyTarget picks every target.
func anyTarget(string) bool { return true }

// inSession lists the targets of a session's records (its home, and what
// lies below it) that pick keeps, inner first. The caller holds mu.
func (m *sessionMounts) inSession(session string, pick func(string) bool) []string {
	prefix := guestSessionDir(session)
	var targets []string
	for target := range m.byTarget {
		if (target == prefix || strings.HasPrefix(target, prefix+"/")) && pick(target) {
			targets = append(targets, target)
		}
	}
	slices.SortFunc(targets, func(a, b string) int { return len(b) - len(a) })
	return targets
}

// use marks a session's mounts in use by a call that has no process of
// the session running yet; the returned func ends the use and withdraws
// the session's mounts if it is then idle. It is safe to call more than
// once.
func (m *sessionMounts) use(session string) (done func()) {
	m.mu.Lock()
	if m.uses == nil {
		m.uses = make(map[string]int)
	}
	m.uses[session]++
	m.mu.Unlock()
	return sync.OnceFunc(func() {
		m.mu.Lock()
		if m.uses[session]--; m.uses[session] <= 0 {
			delete(m.uses, session)
		}
		m.mu.Unlock()
		m.idle(session)
	})
}

// takeOut is how a session event takes mounts out of the guest.
type takeOut struct {
	// ownUses is how many uses the event's own caller holds; -1 takes
	// them out whatever uses and runs (the session was deleted).
	ownUses int
	// unmount: the agent unmounts them too (a failure is logged); without
	// it the guest keeps the mount, which leads nowhere once unshared.
	unmount bool
	// keep keeps the records, withdrawn; without it they are forgotten.
	keep bool
	pick func(target string) bool
}

// take applies t to the session's targets, inner first.
func (m *sessionMounts) take(session string, t takeOut) {
	m.mu.Lock()
	defer m.mu.Unlock()
	targets := m.inSession(session, t.pick)
	if len(targets) == 0 || (t.ownUses >= 0 && m.busy(session, t.ownUses)) {
		return
	}
	for _, target := range targets {
		if t.unmount {
			if err := m.guest.unmountInGuest(target); err != nil {
				m.guest.logger().Warn("unmounting a session's mount in the guest", "session", session, "target", target, "err", err)
			}
		}
		m.drop(target, t.keep)
	}
}

// busy says whether a process of the session runs or more than ownUses
// calls use it. The caller holds mu; Service.mu is taken after it.
func (m *sessionMounts) busy(session string, ownUses int) bool {
	return m.uses[session] > ownUses || m.guest.sessionRuns(session)
}

// idle withdraws a session's mounts when none of its processes runs and
// no call uses them.
func (m *sessionMounts) idle(session string) {
	m.take(session, takeOut{keep: true, pick: anyTarget})
}

// retire unmounts and withdraws the session's spawn mounts but those in
// keep (a fresh start), unless more than the caller's use holds it.
func (m *sessionMounts) retire(session string, keep map[string]bool) {
	m.take(session, takeOut{ownUses: 1, unmount: true, keep: true, pick: func(t string) bool {
		return !keep[t] && isSpawnMount(session, t)
	}})
}

// release unmounts and forgets every mount of an idle session, its
// home's too (a oneShot process's end): the next spawn mounts afresh,
// readFile reads the home from the host.
func (m *sessionMounts) release(session string) {
	m.take(session, takeOut{unmount: true, pick: anyTarget})
}

// forget unshares and forgets every mount of a session whose directory
// was deleted.
func (m *sessionMounts) forget(session string) {
	m.take(session, takeOut{ownUses: -1, pick: anyTarget})
}

// remount mounts again the session's withdrawn targets that pick keeps,
// outer first; onFail says what a failure does (nil: go on).
func (m *sessionMounts) remount(session string, pick func(string) bool, onFail func(target string, err error) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	targets := m.inSession(session, func(t string) bool { return m.byTarget[t].withdrawn && pick(t) })
	for _, target := range slices.Backward(targets) {
		// Its source is looked at again: it may have become a file, or
		// an immutable file another one.
		old := m.byTarget[target].key
		key, err := mountKeyOf(old.host, old.readOnly)
		if old.immutable {
			key, err = immutableKeyOf(old.host)
		}
		if err == nil {
			err = m.mountLocked(target, key)
		}
		if err != nil {
			if err := onFail(target, err); err != nil {
				return err
			}
		}
	}
	return nil
}

// prepareRead readies a session's mounts for a readFile of guestPath:
// it takes a use and mounts again the withdrawn targets that lead to the
// path (its home, then a mount below it), so that a read after the
// session's last process ended sees what it saw before. done ends the
// use, also after an error.
func (m *sessionMounts) prepareRead(session, guestPath string) (done func(), err error) {
	done = m.use(session)
	leadsTo := func(t string) bool { return guestPath == t || strings.HasPrefix(guestPath, t+"/") }
	err = m.remount(session, leadsTo, func(target string, err error) error {
		return fmt.Errorf("mounting %s again: %w", target, err)
	})
	return done, err
}

// spawnMounts is what a spawn asks of its session's mounts, with the host
// side done (the home's directory made, each additionalMounts source
// checked and made).
type spawnMounts struct {
	session string
	home    string // the home's host directory
	entries []spawnMount
	resume  bool // isResume: the withdrawn spawn mounts come back
}

// spawnMount is one additionalMounts entry.
type spawnMount struct {
	name     string // as the client named it, for FailedMounts
	err      error  // its host side failed: nothing is mounted
	host     string
	readOnly bool
	// targets are where it goes: mnt/<name>, then with the skeleton home
	// a configuration entry's <name> in the home.
	targets []string
}

// spawnLease is a spawn's use of its session's mounts: done ends it,
// once the spawn's process is registered (or the spawn failed).
type spawnLease struct {
	failed []string // the entries that could not be mounted
	done   func()
}

// prepare waits for a release of the session still in progress, takes a
// use of it and mounts what the spawn asks (sm): the home, the entries
// (one that fails is reported in failed and logged), then for a resume its
// withdrawn spawn mounts, for a fresh start retire. Only the home's
// failure fails it.
func (m *sessionMounts) prepare(ctx context.Context, sm spawnMounts) (spawnLease, error) {
	if err := m.waitRelease(ctx, sm.session); err != nil {
		return spawnLease{}, fmt.Errorf("waiting for the session's earlier mounts to be released: %w", err)
	}
	lease := spawnLease{failed: []string{}, done: m.use(sm.session)}
	home := guestSessionDir(sm.session)
	if err := m.mount(sm.home, home, false); err != nil {
		lease.done()
		return spawnLease{}, fmt.Errorf("mounting session %s: %w", sm.session, err)
	}
	own := map[string]bool{home: true}
	for _, e := range sm.entries {
		err := e.err
		for i, target := range e.targets {
			if err != nil {
				break
			}
			if err = m.mount(e.host, target, e.readOnly); err == nil {
				own[target] = true
			} else if i > 0 {
				err = fmt.Errorf("in the home: %w", err)
			}
		}
		if err != nil {
			m.guest.logger().Warn("mount failed", "session", sm.session, "mount", e.name, "err", err)
			lease.failed = append(lease.failed, e.name)
		}
	}
	if sm.resume {
		m.restore(sm.session)
	} else {
		m.retire(sm.session, own)
	}
	return lease, nil
}

// restore mounts again the session's spawn mounts withdrawn when its last
// process ended (a resume); one that fails is logged.
func (m *sessionMounts) restore(session string) {
	_ = m.remount(session, func(t string) bool { return isSpawnMount(session, t) }, func(target string, err error) error {
		m.guest.logger().Warn("a resumed session's mount could not be made again", "session", session, "target", target, "err", err)
		return nil
	})
}

// addOneShot records a registered oneShot process: its end releases its
// session (exited).
func (m *sessionMounts) addOneShot(p *process) {
	m.oneShotMu.Lock()
	defer m.oneShotMu.Unlock()
	if m.oneShots == nil {
		m.oneShots = make(map[*process]bool)
	}
	m.oneShots[p] = true
}

// takeOneShot forgets p and says whether it was a oneShot process.
func (m *sessionMounts) takeOneShot(p *process) bool {
	m.oneShotMu.Lock()
	defer m.oneShotMu.Unlock()
	was := m.oneShots[p]
	delete(m.oneShots, p)
	return was
}

// exited takes what an exited process held: its session's mounts go
// (idle) when it was the last, and all of them (release) when it was a
// oneShot process. Called on the agent's read loop before the exit is
// published, so neither runs here (a mount in progress holds mu while it
// waits for a reply this loop reads); a later spawn of the session waits
// for the release (waitRelease).
func (m *sessionMounts) exited(p *process) {
	go m.idle(p.session)
	if !m.takeOneShot(p) {
		return
	}
	done := make(chan struct{})
	m.oneShotMu.Lock()
	if m.releasing == nil {
		m.releasing = make(map[string]chan struct{})
	}
	m.releasing[p.session] = done
	m.oneShotMu.Unlock()
	go func() {
		defer close(done)
		m.release(p.session)
		m.oneShotMu.Lock()
		if m.releasing[p.session] == done {
			delete(m.releasing, p.session)
		}
		m.oneShotMu.Unlock()
	}()
}

// waitRelease waits until no release of session is in progress, or ctx
// ends, or the guest does.
func (m *sessionMounts) waitRelease(ctx context.Context, session string) error {
	m.oneShotMu.Lock()
	done := m.releasing[session]
	m.oneShotMu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-m.guest.vmEnded():
		return errors.New("the VM ended")
	}
}
