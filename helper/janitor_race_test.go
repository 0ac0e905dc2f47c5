package helper

import (
	"context"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Issue #15: a session directory is shared read-write with the guest, which
// can swap any entry in it for a symlink to a host directory at any moment.
// These tests play that guest against the janitor and check that nothing
// outside the sessions directory is touched or counted.

// raceIterations is how many janitor calls each race test of a defect
// makes; the delete test makes fewer (each call recreates the session, and
// deleting one while its guest writes costs ~10 ms on a small disk).
const (
	raceIterations       = 10_000
	deleteRaceIterations = 1_000
)

// outsideFileSize is the apparent size of each file outside the sessions
// directory (sparse): far more than any session here holds.
const outsideFileSize = 1 << 30

// outsideNames are the entries of a host directory outside the sessions
// directory; a swapper's real directory holds the same names, so a janitor
// that lists one and removes by path after a swap hits the other.
var outsideNames = []string{"old-file", "old-dir/inner"}

// oldTime is older than the cutoff every race test prunes with.
var oldTime = time.Now().Add(-48 * time.Hour)

// hostileSession is a session whose tmp and .cache a guest keeps swapping
// for symlinks to host directories outside the sessions directory.
type hostileSession struct {
	t        *testing.T
	outside  string // parent of the outside directories
	swappers []*swapper
	stop     chan struct{}
	wg       sync.WaitGroup
}

// newHostileSession makes session name and starts its swappers.
func newHostileSession(t *testing.T, e *testEnv, name string) *hostileSession {
	dir := filepath.Join(e.s.sessionsDir, name)
	h := &hostileSession{t: t, outside: t.TempDir(), stop: make(chan struct{})}
	writeFile(t, filepath.Join(dir, "keep"), 10)
	for _, entry := range []string{sessionTmpDir, sessionCacheDir} {
		target := filepath.Join(h.outside, entry)
		makeOldTree(t, target, outsideFileSize)
		h.swappers = append(h.swappers, &swapper{path: filepath.Join(dir, entry), target: target})
	}
	for _, w := range h.swappers {
		h.wg.Go(func() { w.run(h.stop) })
	}
	t.Cleanup(h.halt)
	return h
}

// halt stops the swappers (once) and reports how often they flipped.
func (h *hostileSession) halt() {
	select {
	case <-h.stop:
		return
	default:
	}
	close(h.stop)
	h.wg.Wait()
	for _, w := range h.swappers {
		h.t.Logf("%s: %d flips to a symlink and back", filepath.Base(w.path), w.flips.Load())
		assert.Positive(h.t, w.flips.Load(), "the swapper never flipped %s", w.path)
	}
}

// snapshot records every file outside the session: size and mtime.
func (h *hostileSession) snapshot() map[string]fs.FileInfo {
	h.t.Helper()
	got := map[string]fs.FileInfo{}
	require.NoError(h.t, filepath.WalkDir(h.outside, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		got[p] = fi
		return err
	}))
	return got
}

// assertUntouched checks that the outside tree is as before.
func (h *hostileSession) assertUntouched(before map[string]fs.FileInfo) {
	h.t.Helper()
	after := h.snapshot()
	for p, fi := range before {
		a, ok := after[p]
		if !assert.True(h.t, ok, "%s outside the session was removed", p) {
			continue
		}
		assert.Equal(h.t, fi.Size(), a.Size(), p)
		if !fi.IsDir() {
			assert.Equal(h.t, fi.ModTime(), a.ModTime(), p)
		}
	}
	assert.Len(h.t, after, len(before))
}

// makeOldTree makes dir holding outsideNames, files of size bytes, all
// older than the prune cutoff. The caller knows dir is a real directory.
func makeOldTree(t *testing.T, dir string, size int) {
	for _, n := range outsideNames {
		p := filepath.Join(dir, n)
		writeFile(t, p, size)
		require.NoError(t, os.Chtimes(p, oldTime, oldTime))
		require.NoError(t, os.Chtimes(filepath.Dir(p), oldTime, oldTime))
	}
}

// swapper flips path between a real directory (holding old entries named
// as the outside directory's) and a symlink to target, with plain renames,
// as a hostile guest would. Only a swapper makes symlinks, so a path it
// finds to be a real directory stays one while it writes there.
type swapper struct {
	path, target string
	flips        atomic.Int64
}

func (w *swapper) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		w.reset()
		aside, link := w.path+".aside", w.path+".link"
		if os.Rename(w.path, aside) == nil && os.Rename(link, w.path) == nil {
			w.flips.Add(1)
		}
		runtime.Gosched()
		_ = os.Rename(w.path, link)
		_ = os.Rename(aside, w.path)
	}
}

// reset puts a real directory with old entries at path and a symlink to
// target beside it, whatever the janitor removed since.
func (w *swapper) reset() {
	if fi, err := os.Lstat(w.path); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		_ = os.Remove(w.path)
	}
	if _, err := os.Lstat(w.path); err != nil {
		_ = os.Rename(w.path+".aside", w.path)
	}
	_ = os.Mkdir(w.path, 0o755)
	_ = os.Symlink(w.target, w.path+".link")
	if fi, err := os.Lstat(w.path); err != nil || !fi.IsDir() {
		return
	}
	for _, n := range outsideNames {
		p := filepath.Join(w.path, n)
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		_ = os.WriteFile(p, []byte("guest"), 0o644)
		_ = os.Chtimes(p, oldTime, oldTime)
		_ = os.Chtimes(filepath.Dir(p), oldTime, oldTime)
	}
}

// raceCalls runs call n times and logs the time taken.
func raceCalls(t *testing.T, what string, n int, call func()) {
	start := time.Now()
	for range n {
		call()
	}
	t.Logf("%s: %d calls in %v", what, n, time.Since(start).Round(time.Millisecond))
}

// Defect 1: prune lists tmp, then removes its entries by path; a swap in
// between made it delete host files outside the session.
func TestPruneSessionCachesRacingSymlinkSwaps(t *testing.T) {
	e := newTestEnv(t)
	h := newHostileSession(t, e, "hostile")
	before := h.snapshot()
	hour := protocol.Int(3600)
	params := protocol.PruneSessionCachesParams{IncludeSessionTmp: true, SessionTmpOlderThanSeconds: &hour}
	var pruned, failed int
	raceCalls(t, "pruneSessionCaches", raceIterations, func() {
		r, err := e.s.pruneSessionCaches(context.Background(), params)
		require.NoError(t, err)
		if len(r.PrunedSessions) > 0 {
			pruned++
		}
		if len(r.Errors) > 0 {
			failed++
		}
	})
	h.halt()
	t.Logf("%d calls pruned something, %d reported an error", pruned, failed)
	assert.Positive(t, pruned, "the race never pruned anything")
	h.assertUntouched(before)
}

// Defect 6: disk info walked tmp by path; a swap made it count (and read)
// the host directory the symlink pointed to.
func TestDiskInfoRacingSymlinkSwaps(t *testing.T) {
	e := newTestEnv(t)
	h := newHostileSession(t, e, "hostile")
	before := h.snapshot()
	var biggest int64
	raceCalls(t, "getSessionsDiskInfo", raceIterations, func() {
		// Sizes are cached: have each call measure the session afresh
		// (below the low-water mark, the call waits for the measure).
		e.s.sizes.stale("hostile")
		r, err := e.s.getSessionsDiskInfo(context.Background(), protocol.GetSessionsDiskInfoParams{LowWaterBytes: math.MaxInt64})
		require.NoError(t, err)
		require.Len(t, r.Sessions, 1)
		biggest = max(biggest, r.Sessions[0].SizeBytes)
	})
	h.halt()
	t.Logf("largest size reported: %d bytes", biggest)
	assert.Less(t, biggest, int64(outsideFileSize), "the outside directory was counted")
	assert.Positive(t, biggest)
	h.assertUntouched(before)
}

// deleteSessionDirs removes a session whose tmp and .cache are being
// swapped for symlinks; what they point to stays.
func TestDeleteSessionDirsRacingSymlinkSwaps(t *testing.T) {
	e := newTestEnv(t)
	h := newHostileSession(t, e, "hostile")
	before := h.snapshot()
	dir := filepath.Join(e.s.sessionsDir, "hostile")
	var deleted int
	raceCalls(t, "deleteSessionDirs", deleteRaceIterations, func() {
		writeFile(t, filepath.Join(dir, "keep"), 10)
		r, err := e.s.deleteSessionDirs(context.Background(), protocol.DeleteSessionDirsParams{Names: []string{"hostile"}})
		require.NoError(t, err)
		deleted += len(r.Deleted)
	})
	h.halt()
	t.Logf("%d calls deleted the session", deleted)
	assert.Positive(t, deleted)
	h.assertUntouched(before)
}
