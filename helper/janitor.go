package helper

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"time"

	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Host-side session housekeeping: disk info, delete and prune. Every
// session directory is shared read-write with the guest, which may swap any
// entry in it for a symlink at any moment. So each call opens the sessions
// directory (the helper's own, not guest-writable) once and works beneath
// it by descriptor (internal/beneath), never by path: walks never follow a
// symlink, and what a swap points to is neither removed nor counted. Mounts
// live in the guest (the agent's mount namespace or the VM), so a session
// directory on the host holds none; walks stay on its filesystem anyway.

// Cache directories pruneSessionCaches empties, relative to a session.
const (
	sessionCacheDir = ".cache"
	sessionTmpDir   = "tmp"
)

// How many entries one call lists: sessions, and entries of a session's
// tmp for one prune (a guest can make millions; the rest wait for the next).
const (
	maxSessions     = 1 << 16
	maxPruneEntries = 1 << 14
)

// openSessions opens the sessions directory, creating it if need be.
func (s *Service) openSessions() (*beneath.Dir, error) {
	if err := os.MkdirAll(s.sessionsDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", s.sessionsDir, err)
	}
	root, err := beneath.Open(s.sessionsDir)
	if err != nil {
		return nil, fmt.Errorf("opening the sessions directory: %w", err)
	}
	return root, nil
}

// sessionNames lists the session directories (not symlinks, not files),
// sorted.
func sessionNames(root *beneath.Dir) ([]string, error) {
	entries, err := root.Entries(maxSessions)
	if err != nil {
		return nil, fmt.Errorf("listing sessions: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && validateSessionName(e.Name) == nil {
			names = append(names, e.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// statfs is the size and free space of the sessions' filesystem.
func statfs(root *beneath.Dir) (total, free int64, err error) {
	st, err := root.Statfs()
	if err != nil {
		return 0, 0, err
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
}

// listSessions lists the session directories, without creating the
// sessions directory (sizeCache.prime).
func (s *Service) listSessions() ([]string, error) {
	root, err := beneath.Open(s.sessionsDir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return sessionNames(root)
}

// measureSession sizes one session (sizeCache.measure); ok is false when
// it is not (or no longer) a session directory.
func (s *Service) measureSession(name string) (bytes int64, ok bool) {
	root, err := beneath.Open(s.sessionsDir)
	if err != nil {
		return 0, false
	}
	defer root.Close()
	if e, err := root.Stat(name); err != nil || !e.IsDir() {
		return 0, false
	}
	return root.SizeOf(name), true
}

// diskUsage is a profile's disk as getSessionsDiskInfo reports it.
type diskUsage struct {
	total, free int64
	sessions    []protocol.SessionDisk
}

// diskUsage lists the sessions beneath root with their sizes (disksize.go:
// cached; it waits for those never measured, and below lowWater for every
// re-measure pending, within sizeWaitBudget) and the space left: the
// quota's when createVM set one (never more than the filesystem has
// free), else the filesystem's.
func (s *Service) diskUsage(ctx context.Context, root *beneath.Dir, lowWater int64) (diskUsage, error) {
	names, err := sessionNames(root)
	if err != nil {
		return diskUsage{}, err
	}
	hostTotal, hostFree, err := statfs(root)
	if err != nil {
		return diskUsage{}, err
	}
	s.mu.Lock()
	busy := s.procs.busySessions()
	quota := s.diskQuota
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, sizeWaitBudget)
	defer cancel()
	sizes, missing := s.sizes.lookup(names, busy)
	if len(missing) > 0 {
		s.sizes.wait(ctx, missing, false)
		sizes, _ = s.sizes.lookup(names, busy)
	}
	u := usageOf(names, sizes, quota, hostTotal, hostFree)
	if lowWater > 0 && u.free < lowWater {
		// The client reclaims space by these figures: make them exact
		// (an idle session's size is, since its last process ended).
		for n := range busy {
			s.sizes.stale(n)
		}
		s.sizes.wait(ctx, names, true)
		sizes, _ = s.sizes.lookup(names, busy)
		u = usageOf(names, sizes, quota, hostTotal, hostFree)
	}
	return u, nil
}

// usageOf sums sizes against quota (0: none) or the filesystem.
func usageOf(names []string, sizes map[string]int64, quota, hostTotal, hostFree int64) diskUsage {
	u := diskUsage{total: hostTotal, free: hostFree, sessions: make([]protocol.SessionDisk, 0, len(names))}
	var used int64
	for _, n := range names {
		used += sizes[n]
		u.sessions = append(u.sessions, protocol.SessionDisk{Name: n, SizeBytes: sizes[n]})
	}
	if quota > 0 {
		u.total = quota
		u.free = min(max(quota-used, 0), hostFree)
	}
	return u
}

func (s *Service) getSessionsDiskInfo(ctx context.Context, p protocol.GetSessionsDiskInfoParams) (protocol.DiskInfoResult, error) {
	root, err := s.openSessions()
	if err != nil {
		return protocol.DiskInfoResult{}, fmt.Errorf("getSessionsDiskInfo: %w", err)
	}
	defer root.Close()
	u, err := s.diskUsage(ctx, root, int64(p.LowWaterBytes))
	if err != nil {
		return protocol.DiskInfoResult{}, fmt.Errorf("getSessionsDiskInfo: %w", err)
	}
	return protocol.DiskInfoResult{TotalBytes: u.total, FreeBytes: u.free, Sessions: u.sessions}, nil
}

func (s *Service) deleteSessionDirs(_ context.Context, p protocol.DeleteSessionDirsParams) (protocol.DeleteResult, error) {
	res := protocol.DeleteResult{Deleted: []string{}, Errors: map[string]string{}}
	root, err := s.openSessions()
	if err != nil {
		return res, fmt.Errorf("deleteSessionDirs: %w", err)
	}
	defer root.Close()
	for _, name := range p.Names {
		if err := validateSessionName(name); err != nil {
			res.Errors[name] = err.Error()
			continue
		}
		s.mu.Lock()
		busy := s.procs.sessionBusy(name)
		inst := s.guest
		s.mu.Unlock()
		if busy {
			res.Errors[name] = fmt.Sprintf("session %s has a running process; kill it first", name)
			continue
		}
		if err := root.RemoveAll(name); err != nil {
			res.Errors[name] = err.Error()
			continue
		}
		if inst != nil {
			inst.mounts.forget(name)
			if _, err := inst.pruneGuestTmp(protocol.PruneTmpParams{Sessions: []string{name}, Remove: true}); err != nil {
				s.log.Warn("the session's /tmp stays on the guest's disk until the next start", "session", name, "err", err)
			}
		}
		s.sizes.forget(name)
		s.mu.Lock()
		delete(s.innerMounts, name)
		s.mu.Unlock()
		res.Deleted = append(res.Deleted, name)
		s.log.Info("session deleted", "session", name)
	}
	return res, nil
}

func (s *Service) pruneSessionCaches(ctx context.Context, p protocol.PruneSessionCachesParams) (protocol.PruneResult, error) {
	res := protocol.PruneResult{PrunedSessions: []string{}, SkippedSessions: []string{}, Errors: map[string]string{}}
	root, err := s.openSessions()
	if err != nil {
		return res, fmt.Errorf("pruneSessionCaches: %w", err)
	}
	defer root.Close()
	if p.OnlyIfFreeBytesBelow != nil && *p.OnlyIfFreeBytesBelow > 0 {
		// The free space getSessionsDiskInfo reports (the quota's, if set).
		u, err := s.diskUsage(ctx, root, 0)
		if err != nil {
			return res, fmt.Errorf("pruneSessionCaches: %w", err)
		}
		if u.free >= int64(*p.OnlyIfFreeBytesBelow) {
			return res, nil
		}
	}
	names, err := sessionNames(root)
	if err != nil {
		return res, fmt.Errorf("pruneSessionCaches: %w", err)
	}
	var olderThan time.Duration
	if p.SessionTmpOlderThanSeconds != nil && *p.SessionTmpOlderThanSeconds > 0 {
		olderThan = time.Duration(min(int64(*p.SessionTmpOlderThanSeconds), 1<<32)) * time.Second
	}
	cutoff := time.Now().Add(-olderThan)
	var idle []string
	for _, name := range names {
		s.mu.Lock()
		busy := s.procs.sessionBusy(name)
		s.mu.Unlock()
		if busy {
			res.SkippedSessions = append(res.SkippedSessions, name)
			continue
		}
		idle = append(idle, name)
		r := pruneSession(root, name, p.IncludeSessionTmp, cutoff)
		if r.Tried > 0 {
			s.sizes.stale(name)
		}
		res.FreedBytes += r.Freed
		if err := r.Err(); err != nil {
			res.Errors[name] = err.Error()
		}
		if r.RemovedAny() {
			res.PrunedSessions = append(res.PrunedSessions, name)
		}
	}
	if p.IncludeSessionTmp {
		s.pruneGuestTmp(idle, olderThan, &res)
	}
	slices.Sort(res.PrunedSessions)
	res.PrunedSessions = slices.Compact(res.PrunedSessions)
	if res.FreedBytes > 0 {
		s.log.Info("pruned session caches", "sessions", len(res.PrunedSessions), "freedBytes", res.FreedBytes)
	}
	return res, nil
}

// pruneGuestTmp prunes the /tmp on the guest's disk of the sessions names
// (with no root disk, or no guest, there is none) and adds what it did to
// res.
func (s *Service) pruneGuestTmp(names []string, olderThan time.Duration, res *protocol.PruneResult) {
	s.mu.Lock()
	inst := s.guest
	s.mu.Unlock()
	if inst == nil || len(names) == 0 {
		return
	}
	r, err := inst.pruneGuestTmp(protocol.PruneTmpParams{Sessions: names, OlderThanSeconds: int64(olderThan / time.Second)})
	if err != nil {
		s.log.Warn("the sessions' /tmp on the guest's disk was not pruned", "err", err)
		return
	}
	res.FreedBytes += r.FreedBytes
	res.PrunedSessions = append(res.PrunedSessions, r.Pruned...)
	for name, msg := range r.Errors {
		msg = "its /tmp in the guest: " + msg
		if prev := res.Errors[name]; prev != "" {
			msg = prev + "; " + msg
		}
		res.Errors[name] = msg
	}
}

// pruneGuestTmp has the agent clean sessions' /tmp on the root disk as p
// says; it does nothing when they have none there or the guest is not up.
func (inst *guestInstance) pruneGuestTmp(p protocol.PruneTmpParams) (protocol.PruneTmpResult, error) {
	var r protocol.PruneTmpResult
	if !inst.sessionTmp.Load() || !inst.connected.Load() || inst.ending.Load() {
		return r, nil
	}
	err := inst.call(protocol.AgentMethodPruneTmp, p, &r)
	return r, err
}

// pruneSession empties the .cache of the session name and, withTmp, removes
// the entries of its tmp last modified before cutoff.
func pruneSession(root *beneath.Dir, name string, withTmp bool, cutoff time.Time) beneath.Pruned {
	var r beneath.Pruned
	sess, err := root.OpenDir(name)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.Tried, r.Errs = 1, []error{err}
		}
		return r
	}
	defer sess.Close()
	if e, err := sess.Stat(sessionCacheDir); err == nil && e.IsDir() {
		r.Remove(sess, sessionCacheDir)
	}
	if !withTmp {
		return r
	}
	tmp, err := sess.OpenDir(sessionTmpDir)
	if err != nil {
		return r // no tmp, or not a directory: nothing to prune there
	}
	defer tmp.Close()
	r.Add(tmp.PruneOlder(cutoff, maxPruneEntries))
	return r
}
