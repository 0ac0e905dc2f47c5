package helper

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Issue #18: createVM's diskSizeGB and getSessionsDiskInfo's lowWaterBytes
// were dropped, and every call walked every session tree.

func (e *testEnv) diskInfo(lowWater int64) (protocol.DiskInfoResult, map[string]int64) {
	e.t.Helper()
	var r protocol.DiskInfoResult
	e.mustCall("getSessionsDiskInfo", map[string]any{"lowWaterBytes": lowWater}, &r)
	sizes := map[string]int64{}
	for _, s := range r.Sessions {
		sizes[s.Name] = s.SizeBytes
	}
	return r, sizes
}

func TestDiskInfoAgainstTheQuota(t *testing.T) {
	e := newTestEnv(t)
	writeFile(t, filepath.Join(e.s.sessionsDir, "a", "f"), 3000)
	host, _ := e.diskInfo(0)
	e.mustCall("createVM", map[string]any{"bundlePath": "/b", "diskSizeGB": 1}, nil)
	r, sizes := e.diskInfo(0)
	assert.Equal(t, int64(1<<30), r.TotalBytes, "the quota, not the filesystem")
	used := sizes["a"]
	assert.GreaterOrEqual(t, used, int64(3000))
	assert.Equal(t, min(int64(1<<30)-used, host.FreeBytes), r.FreeBytes)

	// A quota smaller than what the sessions hold leaves nothing free.
	e.mustCall("createVM", map[string]any{"bundlePath": "/b", "diskSizeGB": 1e-6}, nil) // ~1 KiB
	r, _ = e.diskInfo(0)
	assert.Equal(t, int64(1073), r.TotalBytes)
	assert.Zero(t, r.FreeBytes)

	// pruneSessionCaches' onlyIfFreeBytesBelow compares the same free space.
	writeFile(t, filepath.Join(e.s.sessionsDir, "a", ".cache", "x"), 100)
	var pruned protocol.PruneResult
	e.mustCall("pruneSessionCaches", map[string]any{"onlyIfFreeBytesBelow": 1}, &pruned)
	assert.Equal(t, []string{"a"}, pruned.PrunedSessions, "the quota is exhausted: prune although the host has room")

	require.Error(t, e.call("createVM", map[string]any{"diskSizeGB": -1}, nil))
	e.mustCall("createVM", map[string]any{"bundlePath": "/b"}, nil) // no size: the quota stays
	r, _ = e.diskInfo(0)
	assert.Equal(t, int64(1073), r.TotalBytes)
}

// Sizes are measured once and again only when a session may have changed:
// a call does not walk every session tree.
func TestDiskInfoMeasuresIncrementally(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	for _, n := range []string{"a", "b", "c"} {
		writeFile(t, filepath.Join(e.s.sessionsDir, n, "f"), 100)
	}
	_, sizes := e.diskInfo(0)
	require.Len(t, sizes, 3)
	walks := e.s.sizes.walkCount()
	for range 5 {
		_, again := e.diskInfo(0)
		assert.Equal(t, sizes, again)
	}
	assert.Equal(t, walks, e.s.sizes.walkCount(), "nothing changed: nothing measured")

	// A process of a ends, having written: a alone is measured again.
	e.spawn(map[string]any{"id": "w", "name": "a", "command": "sh"})
	writeFile(t, filepath.Join(e.s.sessionsDir, "a", "more"), 5000)
	g.agent.exit("w", 0)
	e.next(protocol.EventExit)
	waitFor(t, "a measured again", func() bool {
		_, now := e.diskInfo(0)
		return now["a"] >= sizes["a"]+5000
	})
	_, now := e.diskInfo(0)
	assert.Equal(t, sizes["b"], now["b"])
	assert.Equal(t, walks+1, e.s.sizes.walkCount(), "only a")

	// A change made on the host behind the helper's back shows once the
	// size is older than idleSizeAge.
	writeFile(t, filepath.Join(e.s.sessionsDir, "b", "more"), 7000)
	_, now = e.diskInfo(0)
	assert.Equal(t, sizes["b"], now["b"], "cached")
	e.s.sizes.mu.Lock()
	old := e.s.sizes.sizes["b"]
	old.at = time.Now().Add(-idleSizeAge - time.Second)
	e.s.sizes.sizes["b"] = old
	e.s.sizes.mu.Unlock()
	e.diskInfo(0) // queues b, answers with the old size
	waitFor(t, "b measured again", func() bool {
		_, now := e.diskInfo(0)
		return now["b"] >= sizes["b"]+7000
	})

	// A deleted session is forgotten.
	var del protocol.DeleteResult
	e.mustCall("deleteSessionDirs", map[string]any{"names": []string{"c"}}, &del)
	_, now = e.diskInfo(0)
	assert.NotContains(t, now, "c")
}

// Below the client's lowWaterBytes the figures are made exact before the
// answer: a busy session is measured afresh; above it, the cached size.
func TestDiskInfoBelowLowWaterMeasuresBusySessions(t *testing.T) {
	e := newTestEnv(t)
	e.start()
	e.spawn(map[string]any{"id": "busy", "name": "w", "command": "sh"})
	writeFile(t, filepath.Join(e.s.sessionsDir, "w", "f"), 100)
	r, sizes := e.diskInfo(0)
	before := sizes["w"]
	require.Positive(t, before)

	writeFile(t, filepath.Join(e.s.sessionsDir, "w", "grown"), 50_000) // the guest writes
	_, sizes = e.diskInfo(r.FreeBytes / 2)                             // plenty free: no walk
	assert.Equal(t, before, sizes["w"], "above the low-water mark, the cached size")
	_, sizes = e.diskInfo(r.FreeBytes * 2) // below: exact
	assert.GreaterOrEqual(t, sizes["w"], before+50_000)
}
