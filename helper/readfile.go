package helper

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// readFile reads a guest path of a session. While the guest agent is
// connected and has the session mounted, it reads there (mounts included).
// Otherwise — no guest, one booting, one dead, a helper restarted, a guest
// the session has not been spawned in yet — it reads the session's host
// directory, which is what the guest sees at /sessions/<name>, except where
// a mount covers part of it: mnt/ (where every additionalMounts and
// mountPath entry goes) and any other target a guest of this profile
// mounted below the home are refused, since the host directory beneath
// them is not what the guest saw there (and the host folder behind the
// mount is not the session's to read). The host read goes by descriptor
// beneath the sessions directory (beneath.ReadFile: no symlink at any
// component, regular files only, at most protocol.MaxReadFileBytes).
func (s *Service) readFile(_ context.Context, p protocol.ClientReadFileParams) (protocol.ClientReadFileResult, error) {
	session := p.ProcessName
	s.mu.Lock()
	if proc := s.procs.get(session); proc != nil && !s.sessionExists(session) {
		session = proc.session // a process id where a session name belongs
	}
	inst := s.guest
	s.mu.Unlock()
	if err := validateSessionName(session); err != nil {
		return protocol.ClientReadFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	clean, err := confineToSession(session, p.FilePath)
	if err != nil {
		return protocol.ClientReadFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	if inst == nil || !inst.connected.Load() || !inst.mounts.has(session) {
		content, err := s.readFromHost(session, clean)
		if err != nil {
			return protocol.ClientReadFileResult{}, fmt.Errorf("readFile (from the session's host directory: the guest does not have it): %w", err)
		}
		return protocol.ClientReadFileResult{Content: content}, nil
	}
	done, err := inst.mounts.prepareRead(session, clean)
	defer done()
	if err != nil {
		return protocol.ClientReadFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	var r protocol.ReadFileResult
	if err := inst.call(protocol.AgentMethodReadFile, protocol.ReadFileParams{Path: clean}, &r); err != nil {
		return protocol.ClientReadFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	return protocol.ClientReadFileResult{Content: r.Content}, nil
}

// sessionMountDir is where a session's mounts go below its home.
const sessionMountDir = "mnt"

// readFromHost reads clean, a guest path strictly inside the session's
// home, from the session's host directory (see readFile for what it
// refuses).
func (s *Service) readFromHost(session, clean string) ([]byte, error) {
	rel := strings.TrimPrefix(clean, guestSessionDir(session)+"/")
	if rel == sessionMountDir || strings.HasPrefix(rel, sessionMountDir+"/") {
		return nil, fmt.Errorf("%s is inside the session's mounts (%s), which only the guest can read: start it (startVM) and read again", clean, path.Join(guestSessionDir(session), sessionMountDir))
	}
	s.mu.Lock()
	for target := range s.innerMounts[session] {
		if clean == target || strings.HasPrefix(clean, target+"/") {
			s.mu.Unlock()
			return nil, fmt.Errorf("%s is inside the mount %s, which only the guest can read: start it (startVM) and read again", clean, target)
		}
	}
	s.mu.Unlock()
	root, err := s.openSessions()
	if err != nil {
		return nil, err
	}
	defer root.Close()
	dir, err := root.OpenDir(session)
	if err != nil {
		return nil, fmt.Errorf("session %s: %w", session, err)
	}
	defer dir.Close()
	content, err := dir.ReadFile(rel, protocol.MaxReadFileBytes)
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		err = pe.Err // named by the guest path below, not the host's
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", clean, err)
	}
	return content, nil
}
