package helper

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
)

// GuestSessionsDir is where sessions appear in the guest.
const GuestSessionsDir = "/sessions"

func guestSessionDir(name string) string { return path.Join(GuestSessionsDir, name) }

// sessionOfTarget names the session whose home a guest path is in
// (GuestSessionsDir/<name>[/...]); inner says it lies below the home.
func sessionOfTarget(target string) (session string, inner, ok bool) {
	rest, ok := strings.CutPrefix(path.Clean(target), GuestSessionsDir+"/")
	if !ok {
		return "", false, false
	}
	session, below, _ := strings.Cut(rest, "/")
	return session, below != "", session != ""
}

// validateSessionName refuses names that could leave the sessions directory.
func validateSessionName(name string) error {
	switch {
	case name == "":
		return errors.New("session name is empty")
	case len(name) > 255:
		return errors.New("session name is longer than 255 bytes")
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("session name %q contains '/' or a NUL byte", name)
	case strings.Contains(name, ".."), name == ".":
		return fmt.Errorf("session name %q contains '..' or is '.'", name)
	}
	return nil
}

// ensureSessionDir creates the host directory of a session. The session
// directory is guest-writable, so it works beneath the sessions directory
// by descriptor: what stands at the name must be a real directory, not a
// symlink.
func (s *Service) ensureSessionDir(name string) (string, error) {
	root, err := s.openSessions()
	if err != nil {
		return "", err
	}
	defer root.Close()
	if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating the session directory: %w", err)
	}
	dir, err := root.OpenDir(name)
	if err != nil {
		return "", fmt.Errorf("session %s is not a directory: %w", name, err)
	}
	dir.Close()
	return filepath.Join(s.sessionsDir, name), nil
}

// sessionExists says whether a session directory (not a symlink) exists on
// the host.
func (s *Service) sessionExists(name string) bool {
	if validateSessionName(name) != nil {
		return false
	}
	root, err := beneath.Open(s.sessionsDir)
	if err != nil {
		return false
	}
	defer root.Close()
	e, err := root.Stat(name)
	return err == nil && e.IsDir()
}

// confineToSession cleans a guest path (a relative one is taken relative to
// the session's home) and checks that it lies strictly inside the session's
// home, /sessions/<name>.
func confineToSession(name, guestPath string) (string, error) {
	if guestPath == "" || strings.ContainsRune(guestPath, 0) {
		return "", fmt.Errorf("%q is not a guest path", guestPath)
	}
	home := guestSessionDir(name)
	if !path.IsAbs(guestPath) {
		guestPath = home + "/" + guestPath
	}
	clean := path.Clean(guestPath)
	if !strings.HasPrefix(clean, home+"/") {
		return "", fmt.Errorf("%s is outside session %s (%s)", guestPath, name, home)
	}
	return clean, nil
}
