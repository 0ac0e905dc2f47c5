package helper

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Host-side session housekeeping: disk info, delete and prune. Sessions are
// plain host directories; mounts live in the guest (the agent's mount
// namespace or the VM), so walking a session directory on the host never
// enters a mount source. Walks still never follow symlinks and stay on the
// session directory's filesystem.

// Cache directories pruneSessionCaches empties, relative to a session.
const (
	sessionCacheDir = ".cache"
	sessionTmpDir   = "tmp"
)

// sessionNames lists the session directories (not symlinks, not files).
func (s *Service) sessionNames() ([]string, error) {
	entries, err := os.ReadDir(s.sessionsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing sessions: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && validateSessionName(e.Name()) == nil {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// treeSize sums the apparent size of everything under root, without
// following symlinks or leaving root's filesystem. Unreadable parts are
// skipped: the number is an estimate for the client's janitor.
func treeSize(root string) int64 {
	var rootDev uint64
	if st, err := lstatT(root); err == nil {
		rootDev = st.Dev
	} else {
		return 0
	}
	var total int64
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		st, err := lstatT(p)
		if err != nil {
			return nil
		}
		if d.IsDir() && st.Dev != rootDev {
			return fs.SkipDir
		}
		total += st.Size
		return nil
	})
	return total
}

func lstatT(p string) (*syscall.Stat_t, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("%s: no stat data", p)
	}
	return st, nil
}

func (s *Service) statfs() (total, free int64, err error) {
	if err := os.MkdirAll(s.sessionsDir, 0o700); err != nil {
		return 0, 0, fmt.Errorf("creating %s: %w", s.sessionsDir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.sessionsDir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", s.sessionsDir, err)
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
}

func (s *Service) getSessionsDiskInfo(_ context.Context, _ diskInfoParams) (diskInfoResult, error) {
	total, free, err := s.statfs()
	if err != nil {
		return diskInfoResult{}, fmt.Errorf("getSessionsDiskInfo: %w", err)
	}
	names, err := s.sessionNames()
	if err != nil {
		return diskInfoResult{}, fmt.Errorf("getSessionsDiskInfo: %w", err)
	}
	res := diskInfoResult{TotalBytes: total, FreeBytes: free, Sessions: []sessionDiskInfo{}}
	for _, n := range names {
		res.Sessions = append(res.Sessions, sessionDiskInfo{Name: n, SizeBytes: treeSize(filepath.Join(s.sessionsDir, n))})
	}
	return res, nil
}

func (s *Service) deleteSessionDirs(_ context.Context, p deleteSessionDirsParams) (deleteSessionDirsResult, error) {
	res := deleteSessionDirsResult{Deleted: []string{}, Errors: map[string]string{}}
	for _, name := range p.Names {
		if err := validateSessionName(name); err != nil {
			res.Errors[name] = err.Error()
			continue
		}
		s.mu.Lock()
		busy := s.procs.sessionBusy(name)
		vm := s.vm
		s.mu.Unlock()
		if busy {
			res.Errors[name] = fmt.Sprintf("session %s has a running process; kill it first", name)
			continue
		}
		// RemoveAll removes symlinks, never what they point to.
		if err := os.RemoveAll(filepath.Join(s.sessionsDir, name)); err != nil {
			res.Errors[name] = err.Error()
			continue
		}
		if vm != nil {
			vm.forgetSessionMounts(name)
		}
		res.Deleted = append(res.Deleted, name)
		s.log.Info("session deleted", "session", name)
	}
	return res, nil
}

func (s *Service) pruneSessionCaches(_ context.Context, p pruneParams) (pruneResult, error) {
	res := pruneResult{PrunedSessions: []string{}, SkippedSessions: []string{}, Errors: map[string]string{}}
	if p.OnlyIfFreeBytesBelow != nil && *p.OnlyIfFreeBytesBelow > 0 {
		_, free, err := s.statfs()
		if err != nil {
			return res, fmt.Errorf("pruneSessionCaches: %w", err)
		}
		if free >= int64(*p.OnlyIfFreeBytesBelow) {
			return res, nil
		}
	}
	names, err := s.sessionNames()
	if err != nil {
		return res, fmt.Errorf("pruneSessionCaches: %w", err)
	}
	var olderThan time.Duration
	if p.SessionTmpOlderThanSeconds != nil && *p.SessionTmpOlderThanSeconds > 0 {
		olderThan = time.Duration(min(int64(*p.SessionTmpOlderThanSeconds), 1<<32)) * time.Second
	}
	cutoff := time.Now().Add(-olderThan)
	for _, name := range names {
		s.mu.Lock()
		busy := s.procs.sessionBusy(name)
		s.mu.Unlock()
		if busy {
			res.SkippedSessions = append(res.SkippedSessions, name)
			continue
		}
		dir := filepath.Join(s.sessionsDir, name)
		var victims []string
		if fi, err := os.Lstat(filepath.Join(dir, sessionCacheDir)); err == nil && fi.IsDir() {
			victims = append(victims, filepath.Join(dir, sessionCacheDir))
		}
		if p.IncludeSessionTmp {
			victims = append(victims, oldEntries(filepath.Join(dir, sessionTmpDir), cutoff)...)
		}
		if len(victims) == 0 {
			continue
		}
		var freed int64
		var errs []error
		for _, v := range victims {
			size := treeSize(v)
			if err := os.RemoveAll(v); err != nil {
				errs = append(errs, err)
				continue
			}
			freed += size
		}
		res.FreedBytes += freed
		if len(errs) > 0 {
			res.Errors[name] = errors.Join(errs...).Error()
		}
		if freed > 0 || len(errs) < len(victims) {
			res.PrunedSessions = append(res.PrunedSessions, name)
		}
	}
	slices.Sort(res.PrunedSessions)
	if res.FreedBytes > 0 {
		s.log.Info("pruned session caches", "sessions", len(res.PrunedSessions), "freedBytes", res.FreedBytes)
	}
	return res, nil
}

// oldEntries lists the entries of dir last modified before cutoff.
func oldEntries(dir string, cutoff time.Time) []string {
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue
		}
		if !info.ModTime().After(cutoff) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}
