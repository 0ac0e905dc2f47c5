package helper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// guestInstance is its sessionMounts' mountGuest. sessionRuns and mounted
// take Service.mu while sessionMounts holds its mu: Service.mu is a leaf
// (nothing calls sessionMounts holding it).

// share shares host for a mount in session's home (SessionSharer, where
// the guest has it), or outside any session ("").
func (inst *guestInstance) share(host string, readOnly bool, session string) (protocol.MountSource, error) {
	ss, ok := inst.guest.(SessionSharer)
	if !ok || session == "" {
		return inst.guest.Share(host, readOnly)
	}
	uid, err := inst.uids.of(session)
	if err != nil {
		return protocol.MountSource{}, err
	}
	return ss.ShareForSession(host, readOnly, uid)
}

// shareImmutable shares a file through the guest's cached system share
// where it has one (SystemSharer), else read-only through Share.
func (inst *guestInstance) shareImmutable(host string) (protocol.MountSource, error) {
	if ss, ok := inst.guest.(SystemSharer); ok {
		return ss.ShareSystem(host)
	}
	return inst.guest.Share(host, true)
}

func (inst *guestInstance) unshare(src protocol.MountSource) { inst.guest.Unshare(src) }

func (inst *guestInstance) mountInGuest(m protocol.Mount) error {
	return inst.call(protocol.AgentMethodMount, protocol.MountParams{Mount: m}, nil)
}

func (inst *guestInstance) unmountInGuest(target string) error {
	return inst.call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: target}, nil)
}

func (inst *guestInstance) sessionRuns(session string) bool {
	inst.s.mu.Lock()
	defer inst.s.mu.Unlock()
	return inst.s.procs.sessionBusy(session)
}

func (inst *guestInstance) mounted(target string)    { inst.s.noteInnerMount(target) }
func (inst *guestInstance) vmEnded() <-chan struct{} { return inst.ended }
func (inst *guestInstance) logger() *slog.Logger     { return inst.s.log }

// noteInnerMount records a mount target below a session's home
// (Service.innerMounts): the host directory beneath it is not what the
// guest sees there.
func (s *Service) noteInnerMount(target string) {
	session, inner, ok := sessionOfTarget(target)
	if !ok || !inner {
		return // the home itself: its host directory is what the guest sees
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.innerMounts[session] == nil {
		s.innerMounts[session] = map[string]bool{}
	}
	s.innerMounts[session][target] = true
}

// mountSource checks (and for a writable mount makes) the host side of a
// mount the client asks for: a path relative to / and a mode.
func mountSource(hostRel, mode string) (host string, readOnly bool, err error) {
	if host, err = hostPathFromClient(hostRel); err != nil {
		return "", false, err
	}
	if readOnly, err = mountMode(mode); err != nil {
		return "", false, err
	}
	if _, err := os.Stat(host); errors.Is(err, os.ErrNotExist) {
		if readOnly {
			return "", false, fmt.Errorf("read-only mount source %s does not exist", host)
		}
		if err := os.MkdirAll(host, 0o755); err != nil {
			return "", false, fmt.Errorf("creating mount source: %w", err)
		}
	} else if err != nil {
		return "", false, fmt.Errorf("mount source: %w", err)
	}
	return host, readOnly, nil
}

// sessionMountTarget is where a mount named mountName goes in a session:
// /sessions/<name>/mnt/<mountName>; rel is the clean name.
func sessionMountTarget(session, mountName string) (target, rel string, err error) {
	if rel, err = cleanMountName(mountName); err != nil {
		return "", "", err
	}
	return path.Join(guestSessionDir(session), sessionMountDir, rel), rel, nil
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
	home, err := s.ensureSessionDir(proc.session)
	if err != nil {
		return nil, fmt.Errorf("mountPath: %w", err)
	}
	if err := inst.mounts.mount(home, guestSessionDir(proc.session), false); err != nil {
		return nil, fmt.Errorf("mountPath: mounting session %s: %w", proc.session, err)
	}
	target, _, err := sessionMountTarget(proc.session, p.MountName)
	if err != nil {
		return nil, fmt.Errorf("mountPath: %w", err)
	}
	host, readOnly, err := mountSource(p.Subpath, p.Mode)
	if err != nil {
		return nil, fmt.Errorf("mountPath: %w", err)
	}
	if err := inst.mounts.mount(host, target, readOnly); err != nil {
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
	return inst.mounts.mount(host, path.Clean(guestPath), readOnly)
}
