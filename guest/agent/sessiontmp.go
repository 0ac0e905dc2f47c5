package agent

// Sessions' /tmp on the root disk (with a root disk: the VM).
//
// Without a root disk each isolated spawn's /tmp is a tmpfs of its own, in
// guest RAM. With one, a large build would fill that RAM; so a session's
// spawns share a directory of the session's on the disk, tmp/<session>,
// bound at their /tmp. Like a tmpfs /tmp it starts empty at each start of
// the guest: the previous start's tmp is set aside (renamed, which is
// instant) and removed in the background. pruneSessionCaches removes its
// old entries and deleteSessionDirs all of it, through AgentMethodPruneTmp:
// the host never reads the guest's disk. What a session writes there is
// hostile: the agent removes it by descriptor (package beneath), never
// following a symlink the session planted.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const (
	// sessionTmpName is the sessions' /tmp directory on the root disk;
	// staleTmpPrefix names an earlier start's, set aside for removal.
	sessionTmpName = "tmp"
	staleTmpPrefix = "tmp.old-"
	// maxPruneEntries bounds the entries of one session's /tmp one prune
	// looks at (a session can make millions; the rest wait).
	maxPruneEntries = 1 << 14
	// maxPruneSessions bounds the sessions one prune names.
	maxPruneSessions = 1 << 16
)

// startSessionTmp makes the sessions' /tmp a fresh directory on the disk
// mounted at disk, setting aside the previous start's, which it removes in
// the background with any older leftovers.
func (m *mounter) startSessionTmp(disk string) error {
	if err := m.renewSessionTmp(disk); err != nil {
		return err
	}
	go m.removeStaleTmp(disk)
	return nil
}

// renewSessionTmp makes the sessions' /tmp a fresh directory on the disk
// mounted at disk, setting the previous one aside (for removeStaleTmp).
func (m *mounter) renewSessionTmp(disk string) error {
	dir := path.Join(disk, sessionTmpName)
	if _, err := os.Lstat(dir); err == nil {
		aside := path.Join(disk, staleTmpPrefix+strconv.FormatInt(time.Now().UnixNano(), 10))
		if err := os.Rename(dir, aside); err != nil {
			return fmt.Errorf("setting the previous start's /tmp aside: %w", err)
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("the sessions' /tmp on the root disk: %w", err)
	}
	m.mu.Lock()
	m.sessionTmp = dir
	m.mu.Unlock()
	return nil
}

// sessionTmpDisk is the disk the sessions' /tmp is on ("": none).
func (m *mounter) sessionTmpDisk() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessionTmp == "" {
		return ""
	}
	return path.Dir(m.sessionTmp)
}

// removeStaleTmp removes what earlier starts left of their sessions' /tmp
// on the disk mounted at disk; what it cannot is logged and tried again at
// the next start.
func (m *mounter) removeStaleTmp(disk string) {
	d, err := beneath.Open(disk)
	if err != nil {
		m.log.Warn("cannot remove earlier starts' /tmp from the root disk", "err", err)
		return
	}
	defer d.Close()
	entries, err := d.Entries(maxPruneEntries)
	if err != nil {
		m.log.Warn("cannot remove earlier starts' /tmp from the root disk", "err", err)
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name, staleTmpPrefix) {
			continue
		}
		if err := d.RemoveAll(e.Name); err != nil {
			m.log.Warn("cannot remove an earlier start's /tmp from the root disk", "dir", e.Name, "err", err)
		}
	}
}

// hasSessionTmp says whether the sessions' /tmp is on the root disk.
func (m *mounter) hasSessionTmp() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessionTmp != ""
}

// sessionTmpFor returns the directory bound at the /tmp of session's
// spawns, creating it (world-writable and sticky, as /tmp is); "" when
// their /tmp is a tmpfs of their own (no root disk).
func (m *mounter) sessionTmpFor(session string) (string, error) {
	m.mu.Lock()
	root := m.sessionTmp
	m.mu.Unlock()
	if root == "" {
		return "", nil
	}
	dir := path.Join(root, session)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("session %s's /tmp: %w", session, err)
	}
	// Past the umask; the entry is the agent's (tmp/ is out of the
	// sessions' sight), so the path is safe to use.
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
		return "", fmt.Errorf("session %s's /tmp: %w", session, err)
	}
	return dir, nil
}

// pruneTmp cleans the sessions' /tmp on the disk as p says.
func (m *mounter) pruneTmp(p protocol.PruneTmpParams) (protocol.PruneTmpResult, error) {
	res := protocol.PruneTmpResult{Pruned: []string{}, Errors: map[string]string{}}
	if len(p.Sessions) > maxPruneSessions {
		return res, fmt.Errorf("%d sessions named; at most %d at a time", len(p.Sessions), maxPruneSessions)
	}
	m.mu.Lock()
	root := m.sessionTmp
	m.mu.Unlock()
	if root == "" {
		return res, nil // no /tmp on a disk: nothing outlives a spawn
	}
	dir, err := beneath.Open(root)
	if err != nil {
		return res, fmt.Errorf("the sessions' /tmp: %w", err)
	}
	defer dir.Close()
	cutoff := time.Now().Add(-time.Duration(min(max(p.OlderThanSeconds, 0), 1<<32)) * time.Second)
	for _, session := range p.Sessions {
		if _, err := spawnSession(session); err != nil {
			res.Errors[session] = err.Error()
			continue
		}
		r := pruneSessionTmp(dir, session, p.Remove, cutoff)
		res.FreedBytes += r.Freed
		if err := r.Err(); err != nil {
			res.Errors[session] = err.Error()
		}
		if r.RemovedAny() {
			res.Pruned = append(res.Pruned, session)
		}
	}
	return res, nil
}

// pruneSessionTmp removes session's /tmp below dir (remove) or its
// entries last modified before cutoff.
func pruneSessionTmp(dir *beneath.Dir, session string, remove bool, cutoff time.Time) beneath.Pruned {
	var r beneath.Pruned
	if remove {
		if _, err := dir.Stat(session); err == nil {
			r.Remove(dir, session)
		}
		return r
	}
	sub, err := dir.OpenDir(session)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.Tried, r.Errs = 1, []error{err}
		}
		return r
	}
	defer sub.Close()
	return sub.PruneOlder(cutoff, maxPruneEntries)
}
