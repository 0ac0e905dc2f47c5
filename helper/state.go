package helper

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// The data directory (Options.DataDir), and what a restart finds there:
//
//	helper.json                  the last profile a configure named (one-shot
//	                             calls act on it, also after a restart)
//	sessions/<name>/             the sessions of the first profile of the
//	                             desktop client (one with a userDataRoot) the
//	                             helper met on this data directory (the layout
//	                             of a helper before profiles, so an upgrade
//	                             keeps every session where it was)
//	profiles/<id>/profile.json   one profile's state: configure's sizing,
//	                             createVM's disk quota, the installed SDK, the
//	                             approved OAuth token, and whether it owns
//	                             sessions/
//	profiles/<id>/sessions/<name>/  every other profile's sessions
//
// <id> is the profile's userDataName made safe for a file name and a hash
// of its userDataRoot and userDataName (profileID). State files are 0600 in
// 0700 directories and written atomically (a temporary file beside the
// old one, synced, renamed over it, the directory synced), so a helper
// killed mid-write leaves the old state or the new, never a mix. Running
// processes are not state: a guest dies with its helper, and a restarted
// helper reports none of them as running.

// Names in the data directory.
const (
	helperStateFile  = "helper.json"
	profileStateFile = "profile.json"
	profilesDirName  = "profiles"
	sessionsDirName  = "sessions"
)

// stateVersion is written into every state file; a file of a later version
// is read as far as its fields are understood.
const stateVersion = 1

// profileKey identifies a profile: the client's userDataName and
// userDataRoot (one Electron profile each). The zero key is the default
// profile, used by calls made before any configure.
type profileKey struct{ name, root string }

func (k profileKey) isDefault() bool { return k == profileKey{} }

// wire is the key as state files spell it.
func (k profileKey) wire() *wireKey { return &wireKey{UserDataName: k.name, UserDataRoot: k.root} }

type wireKey struct {
	UserDataName string `json:"userDataName"`
	UserDataRoot string `json:"userDataRoot"`
}

func (w *wireKey) key() profileKey { return profileKey{name: w.UserDataName, root: w.UserDataRoot} }

// profileID names a profile's directory below profiles/: its name with
// every byte outside [A-Za-z0-9._-] replaced (at most 32 bytes, "default"
// when empty), a dash, and 16 hex digits of SHA-256 over root and name, so
// that two profiles of the same name under different roots, or names that
// the replacement makes equal, stay apart.
func profileID(k profileKey) string {
	sum := sha256.Sum256([]byte(k.root + "\x00" + k.name))
	safe := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		case r == '.':
			return '.'
		}
		return '_'
	}, k.name)
	if len(safe) > 32 {
		safe = safe[:32]
	}
	safe = strings.TrimLeft(safe, ".") // no hidden names, no "." or ".."
	if safe == "" {
		safe = "default"
	}
	return safe + "-" + hex.EncodeToString(sum[:8])
}

// helperState is helper.json.
type helperState struct {
	Version     int      `json:"version"`
	LastProfile *wireKey `json:"lastProfile,omitempty"`
}

// profileState is a profile's profile.json: what the client set and relies
// on after a restart.
type profileState struct {
	Version int `json:"version"`
	wireKey
	// OwnsDataSessions: this profile's sessions are <data>/sessions.
	OwnsDataSessions bool `json:"ownsDataSessions,omitempty"`
	MemoryMB         int  `json:"memoryMB,omitempty"`
	CPUCount         int  `json:"cpuCount,omitempty"`
	// DiskQuotaBytes is createVM's diskSizeGB in bytes (0: no quota).
	DiskQuotaBytes int64 `json:"diskQuotaBytes,omitempty"`
	// SDK is the last installSdk: the host file and its version.
	SDK *sdkState `json:"sdk,omitempty"`
	// OAuthToken is the last addApprovedOauthToken.
	OAuthToken string `json:"oauthToken,omitempty"`
}

type sdkState struct {
	Version string `json:"version"`
	File    string `json:"file"`
}

// store reads and writes the state files of a data directory. A nil
// *store (Options.Stateless) reads nothing and keeps nothing.
type store struct {
	dir string
	log *slog.Logger
}

func (st *store) profileDir(k profileKey) string {
	return filepath.Join(st.dir, profilesDirName, profileID(k))
}

// loadHelper reads helper.json; a missing file is the empty state, an
// unreadable one is logged and read as empty.
func (st *store) loadHelper() helperState {
	var hs helperState
	if st == nil {
		return hs
	}
	if err := readJSON(filepath.Join(st.dir, helperStateFile), &hs); err != nil && !errors.Is(err, fs.ErrNotExist) {
		st.log.Error("the helper's state file is unreadable; starting without it", "err", err)
		return helperState{}
	}
	return hs
}

func (st *store) saveHelper(hs helperState) error {
	if st == nil {
		return nil
	}
	hs.Version = stateVersion
	return writeJSON(filepath.Join(st.dir, helperStateFile), hs)
}

// profiles is what loadProfiles found: every readable profile state by
// id, and whether some profile.json could not be read (its profile might
// own <data>/sessions, so no other profile may claim it).
type profiles struct {
	byID       map[string]profileState
	unreadable bool
}

// owner returns the profile owning <data>/sessions, if one does.
func (p profiles) owner() (profileKey, bool) {
	for _, ps := range p.byID {
		if ps.OwnsDataSessions {
			return ps.key(), true
		}
	}
	return profileKey{}, false
}

// loadProfiles reads every profiles/*/profile.json.
func (st *store) loadProfiles() profiles {
	out := profiles{byID: map[string]profileState{}}
	if st == nil {
		return out
	}
	entries, err := os.ReadDir(filepath.Join(st.dir, profilesDirName))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			st.log.Error("cannot list the profiles' state", "err", err)
			out.unreadable = true
		}
		return out
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		var ps profileState
		err := readJSON(filepath.Join(st.dir, profilesDirName, e.Name(), profileStateFile), &ps)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			st.log.Error("a profile's state file is unreadable; it is ignored", "profile", e.Name(), "err", err)
			out.unreadable = true
		case profileID(ps.key()) != e.Name():
			st.log.Error("a profile's state file names another profile; it is ignored", "dir", e.Name(), "profile", ps.UserDataName)
			out.unreadable = true
		default:
			out.byID[e.Name()] = ps
		}
	}
	return out
}

func (st *store) saveProfile(ps profileState) error {
	if st == nil {
		return nil
	}
	ps.Version = stateVersion
	dir := st.profileDir(ps.key())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("saving the profile's state: %w", err)
	}
	return writeJSON(filepath.Join(dir, profileStateFile), ps)
}

// maxStateFile bounds a state file read (they hold a few hundred bytes).
const maxStateFile = 1 << 20

func readJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > maxStateFile {
		return fmt.Errorf("%s is larger than %d bytes", path, maxStateFile)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// writeJSON replaces path with v's JSON atomically: a 0600 temporary file
// in the same directory, synced, renamed over path; then the directory is
// synced so the rename survives a crash of the machine.
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// restore takes a profile's saved state. An SDK whose host file is gone is
// forgotten (the client installs one again); the rest is taken as saved.
func (s *Service) restore(ps profileState) {
	s.ownsData = ps.OwnsDataSessions
	if ps.MemoryMB > 0 && ps.MemoryMB < 1<<30 {
		s.memoryMB = ps.MemoryMB
	}
	if ps.CPUCount > 0 && ps.CPUCount < 1<<16 {
		s.cpuCount = ps.CPUCount
	}
	if ps.DiskQuotaBytes > 0 {
		s.diskQuota = ps.DiskQuotaBytes
	}
	s.oauthToken = ps.OAuthToken
	if sdk := ps.SDK; sdk != nil {
		if fi, err := os.Stat(sdk.File); err == nil && fi.Mode().IsRegular() && filepath.IsAbs(sdk.File) {
			s.sdk = &sdkInstall{version: sdk.Version, file: sdk.File}
		} else {
			s.log.Warn("the SDK installed before the restart is gone; it is forgotten until installSdk", "version", sdk.Version, "path", sdk.File)
		}
	}
	if s.sdk != nil || ps.OAuthToken != "" || ps.DiskQuotaBytes > 0 || ps.MemoryMB > 0 {
		s.log.Info("profile state restored", "memoryMB", s.memoryMB, "cpus", s.cpuCount,
			"diskQuotaBytes", s.diskQuota, "sdk", s.sdk != nil, "oauthToken", s.oauthToken != "")
	}
}

// persist saves the profile's state (profile.json). A failure is logged,
// not returned: the call that changed the state has taken effect, only a
// restart would lose it.
func (s *Service) persist() {
	if s.h.store == nil {
		return
	}
	s.persistMu.Lock()
	defer s.persistMu.Unlock()
	s.mu.Lock()
	ps := profileState{
		wireKey: *s.key.wire(), OwnsDataSessions: s.ownsData,
		MemoryMB: s.memoryMB, CPUCount: s.cpuCount, DiskQuotaBytes: s.diskQuota,
		OAuthToken: s.oauthToken,
	}
	if s.sdk != nil {
		ps.SDK = &sdkState{Version: s.sdk.version, File: s.sdk.file}
	}
	s.mu.Unlock()
	if err := s.h.store.saveProfile(ps); err != nil {
		s.log.Warn("cannot save the profile's state; a restart will lose it", "err", err)
	}
}
