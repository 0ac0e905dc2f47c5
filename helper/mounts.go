package helper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// cleanMountName turns a mountName (which may contain '/') into a relative
// path below the session's mnt directory, refusing '..' components.
func cleanMountName(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("mount name %q is empty or contains a NUL byte", name)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("mount name %q is absolute", name)
	}
	if slices.Contains(strings.Split(name, "/"), "..") {
		return "", fmt.Errorf("mount name %q contains a '..' component", name)
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", fmt.Errorf("mount name %q names no directory", name)
	}
	return clean, nil
}

// hostPathFromClient turns a path "relative to /" as the client sends it
// into an absolute host path.
func hostPathFromClient(p string) (string, error) {
	if strings.TrimLeft(p, "/") == "" || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("host path %q is empty or contains a NUL byte", p)
	}
	return filepath.Clean("/" + p), nil
}

// mountMode parses a mode: "" and "rw" and "rwd" are writable, "ro" is not.
func mountMode(mode string) (readOnly bool, err error) {
	switch mode {
	case "", "rw", "rwd":
		return false, nil
	case "ro":
		return true, nil
	}
	return false, fmt.Errorf("unknown mount mode %q (want rw, ro or rwd)", mode)
}

// mountRecord is what mount put at a guest target: what was asked for
// (key) and the source the guest got for it (src), which is withdrawn
// (Guest.Unshare) when the target is mounted anew, when its session is
// deleted, and when its session's last process ends. A withdrawn record
// stays (withdrawn set, src zero) so that readFile can mount it again.
type mountRecord struct {
	key       mountKey
	src       protocol.MountSource
	withdrawn bool
}

// mountTable is a guest's mount bookkeeping, guarded by
// vmInstance.mountMu; its zero value is ready to use.
type mountTable struct {
	byTarget map[string]mountRecord
	// users counts, per session, the calls that use its mounts while no
	// process of theirs runs yet (a spawn until its process is registered,
	// a readFile): withdrawIfIdle leaves the session alone meanwhile.
	users map[string]int
}

func (t *mountTable) set(target string, r mountRecord) {
	if t.byTarget == nil {
		t.byTarget = make(map[string]mountRecord)
	}
	t.byTarget[target] = r
}

// inSession lists the targets of a session's mounts: its home and what
// lies below it.
func (t *mountTable) inSession(name string) []string {
	prefix := guestSessionDir(name)
	var targets []string
	for target := range t.byTarget {
		if target == prefix || strings.HasPrefix(target, prefix+"/") {
			targets = append(targets, target)
		}
	}
	return targets
}

// mount makes a host path visible at a guest target, unless the same thing
// is mounted there already (spawns of one session repeat their mounts). A
// single file is shared as itself (Guest.Share), never as its directory.
// What was mounted at target before is withdrawn once the agent has
// replaced it — and also if the agent failed to (it unmounts the old
// mount first): a target remounted read-only must not stay writable.
func (inst *guestInstance) mount(host, target string, readOnly bool) error {
	fi, err := os.Stat(host)
	if err != nil {
		return fmt.Errorf("mount source: %w", err)
	}
	key := mountKey{host: host, readOnly: readOnly}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("mount source %s is neither a directory nor a regular file", host)
		}
		key.file = filepath.Base(host)
	}
	inst.mountMu.Lock()
	defer inst.mountMu.Unlock()
	old, had := inst.mounts.byTarget[target]
	if had && old.key == key && !old.withdrawn {
		return nil
	}
	src, err := inst.guest.Share(host, readOnly)
	if err != nil {
		return fmt.Errorf("sharing %s with the guest: %w", host, err)
	}
	m := protocol.Mount{Source: src, Target: target, ReadOnly: readOnly, SourceFile: key.file}
	err = inst.call(protocol.AgentMethodMount, protocol.MountParams{Mount: m}, nil)
	if had {
		if !old.withdrawn {
			inst.guest.Unshare(old.src)
		}
		delete(inst.mounts.byTarget, target)
	}
	if err != nil {
		inst.guest.Unshare(src)
		return err
	}
	inst.mounts.set(target, mountRecord{key: key, src: src})
	inst.s.noteInnerMount(target)
	return nil
}

// noteInnerMount records a mount target below a session's home
// (Service.innerMounts): the host directory beneath it is not what the
// guest sees there.
func (s *Service) noteInnerMount(target string) {
	rest, ok := strings.CutPrefix(target, GuestSessionsDir+"/")
	if !ok {
		return
	}
	session, inner, ok := strings.Cut(rest, "/")
	if !ok || inner == "" {
		return // the home itself: its host directory is what the guest sees
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.innerMounts[session] == nil {
		s.innerMounts[session] = map[string]bool{}
	}
	s.innerMounts[session][target] = true
}

// forgetSessionMounts withdraws a session's mounts and drops their records
// (its host directory was deleted; the next spawn mounts it afresh).
func (inst *guestInstance) forgetSessionMounts(name string) {
	inst.mountMu.Lock()
	defer inst.mountMu.Unlock()
	for _, target := range inst.mounts.inSession(name) {
		if r := inst.mounts.byTarget[target]; !r.withdrawn {
			inst.guest.Unshare(r.src)
		}
		delete(inst.mounts.byTarget, target)
	}
}

// useSession marks a session's mounts in use by a call that has no running
// process of the session to show for it yet (spawn, readFile); the
// returned func ends the use and withdraws the mounts if the session is
// then idle.
func (inst *guestInstance) useSession(name string) (done func()) {
	inst.mountMu.Lock()
	if inst.mounts.users == nil {
		inst.mounts.users = make(map[string]int)
	}
	inst.mounts.users[name]++
	inst.mountMu.Unlock()
	return func() {
		inst.mountMu.Lock()
		if inst.mounts.users[name]--; inst.mounts.users[name] <= 0 {
			delete(inst.mounts.users, name)
		}
		inst.mountMu.Unlock()
		inst.withdrawIfIdle(name)
	}
}

// withdrawIfIdle withdraws a session's mounts when none of its processes
// runs and no call uses them (its last process ended, or a spawn failed):
// the guest keeps no way into the session's files; the records stay, and
// the next spawn (or readFile) mounts them afresh. Lock order: mountMu,
// then Service.mu.
func (inst *guestInstance) withdrawIfIdle(name string) {
	inst.mountMu.Lock()
	defer inst.mountMu.Unlock()
	if !inst.sessionIdle(name, 0) {
		return
	}
	for _, target := range inst.mounts.inSession(name) {
		r := inst.mounts.byTarget[target]
		if r.withdrawn {
			continue
		}
		inst.guest.Unshare(r.src)
		inst.mounts.byTarget[target] = mountRecord{key: r.key, withdrawn: true}
	}
}

// mountsSession says whether this guest has mounted anything of a session
// (now, or withdrawn since).
func (inst *guestInstance) mountsSession(name string) bool {
	inst.mountMu.Lock()
	defer inst.mountMu.Unlock()
	return len(inst.mounts.inSession(name)) > 0
}

// remountForRead mounts again, for readFile, the withdrawn mounts of a
// session that lead to guestPath (its home, then a mount below it), so
// that a read after the session's last process ended sees what it saw
// before. The caller holds a useSession of the session.
func (inst *guestInstance) remountForRead(session, guestPath string) error {
	inst.mountMu.Lock()
	var again []string
	for _, target := range inst.mounts.inSession(session) {
		if inst.mounts.byTarget[target].withdrawn && (guestPath == target || strings.HasPrefix(guestPath, target+"/")) {
			again = append(again, target)
		}
	}
	keys := make(map[string]mountKey, len(again))
	for _, target := range again {
		keys[target] = inst.mounts.byTarget[target].key
	}
	inst.mountMu.Unlock()
	slices.SortFunc(again, func(a, b string) int { return len(a) - len(b) }) // outer first
	for _, target := range again {
		if err := inst.mount(keys[target].host, target, keys[target].readOnly); err != nil {
			return fmt.Errorf("mounting %s again: %w", target, err)
		}
	}
	return nil
}

// mountSession mounts a session's home directory.
func (s *Service) mountSession(inst *guestInstance, name string) error {
	dir, err := s.ensureSessionDir(name)
	if err != nil {
		return err
	}
	if err := inst.mount(dir, guestSessionDir(name), false); err != nil {
		return fmt.Errorf("mounting session %s: %w", name, err)
	}
	return nil
}

// mountInSession mounts a host path (relative to /, as the client sends it)
// at /sessions/<name>/mnt/<mountName>.
func (s *Service) mountInSession(inst *guestInstance, session, mountName, hostRel, mode string) error {
	rel, err := cleanMountName(mountName)
	if err != nil {
		return err
	}
	host, err := hostPathFromClient(hostRel)
	if err != nil {
		return err
	}
	readOnly, err := mountMode(mode)
	if err != nil {
		return err
	}
	if _, err := os.Stat(host); errors.Is(err, os.ErrNotExist) {
		if readOnly {
			return fmt.Errorf("read-only mount source %s does not exist", host)
		}
		if err := os.MkdirAll(host, 0o755); err != nil {
			return fmt.Errorf("creating mount source: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("mount source: %w", err)
	}
	return inst.mount(host, path.Join(guestSessionDir(session), "mnt", rel), readOnly)
}

func (s *Service) mountPath(_ context.Context, p protocol.MountPathParams) (empty, error) {
	s.mu.Lock()
	proc := s.procs.get(p.ProcessID)
	s.mu.Unlock()
	if proc == nil {
		return nil, fmt.Errorf("mountPath: no process with id %q", p.ProcessID)
	}
	inst, err := s.activeVM()
	if err != nil {
		return nil, fmt.Errorf("mountPath: %w", err)
	}
	if err := s.mountSession(inst, proc.session); err != nil {
		return nil, fmt.Errorf("mountPath: %w", err)
	}
	if err := s.mountInSession(inst, proc.session, p.MountName, p.Subpath, p.Mode); err != nil {
		return nil, fmt.Errorf("mountPath: %w", err)
	}
	s.log.Info("mounted", "session", proc.session, "mount", p.MountName)
	return nil, nil
}

// AddGuestMount mounts a host path at any absolute guest path in the
// running guest (the run subcommand's --mount; the client cannot do this).
func (s *Service) AddGuestMount(hostPath, guestPath string, readOnly bool) error {
	if !path.IsAbs(guestPath) {
		return fmt.Errorf("guest path %q is not absolute", guestPath)
	}
	host, err := filepath.Abs(hostPath)
	if err != nil {
		return err
	}
	inst, err := s.activeVM()
	if err != nil {
		return err
	}
	return inst.mount(host, path.Clean(guestPath), readOnly)
}
