package helper

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeFile makes the file path (and its parents) of size zero bytes
// (sparse, so that a large one costs nothing).
func writeFile(t *testing.T, path string, size int) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, nil, 0o644))
	require.NoError(t, os.Truncate(path, int64(size)))
}

func TestDiskInfo(t *testing.T) {
	e := newTestEnv(t)
	var empty map[string]any
	e.mustCall("getSessionsDiskInfo", map[string]any{"lowWaterBytes": 0}, &empty)
	assert.Equal(t, []any{}, empty["sessions"], "no sessions: an empty array, not null")

	dir := filepath.Join(e.s.sessionsDir)
	writeFile(t, filepath.Join(dir, "a", "f"), 1000)
	writeFile(t, filepath.Join(dir, "a", "sub", "g"), 24)
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "big"), 1<<20)
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "a", "link"))) // not followed
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "notasession")))
	writeFile(t, filepath.Join(dir, "stray-file"), 5)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "b"), 0o700))

	var r protocol.DiskInfoResult
	e.mustCall("getSessionsDiskInfo", map[string]any{"lowWaterBytes": 1}, &r)
	assert.Positive(t, r.TotalBytes)
	assert.Positive(t, r.FreeBytes)
	assert.LessOrEqual(t, r.FreeBytes, r.TotalBytes)
	sizes := map[string]int64{}
	for _, s := range r.Sessions {
		sizes[s.Name] = s.SizeBytes
	}
	require.Len(t, sizes, 2)
	assert.GreaterOrEqual(t, sizes["a"], int64(1024))
	assert.Less(t, sizes["a"], int64(1<<20), "the symlinked megabyte is not counted")
	assert.Contains(t, sizes, "b")
}

func TestDeleteSessionDirs(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "keep"), 3)
	e.spawn(map[string]any{"id": "busy", "name": "busy", "command": "sh"})
	e.spawn(map[string]any{"id": "idle", "name": "idle", "command": "sh",
		"additionalMounts": map[string]any{"m": map[string]string{"path": src[1:], "mode": "rw"}}})
	g.agent.exit("idle", 0)
	waitFor(t, "idle exited", func() bool {
		var pr protocol.IsProcessRunningResult
		e.mustCall("isProcessRunning", map[string]any{"id": "idle"}, &pr)
		return !pr.Running
	})
	idleDir := filepath.Join(e.s.sessionsDir, "idle")
	writeFile(t, filepath.Join(idleDir, "data"), 10)
	require.NoError(t, os.Symlink(src, filepath.Join(idleDir, "link-out")))

	var r protocol.DeleteResult
	e.mustCall("deleteSessionDirs", map[string]any{"names": []string{"../..", "a/b", "busy", "idle", ""}}, &r)
	assert.Equal(t, []string{"idle"}, r.Deleted)
	assert.Len(t, r.Errors, 4)
	assert.Contains(t, r.Errors, "../..")
	assert.Contains(t, r.Errors["busy"], "running process")
	assert.NoDirExists(t, idleDir)
	assert.DirExists(t, filepath.Join(e.s.sessionsDir, "busy"))
	assert.FileExists(t, filepath.Join(src, "keep"), "mount sources are untouched")

	// The deleted session's mounts are made again on its next spawn.
	e.spawn(map[string]any{"id": "idle2", "name": "idle", "command": "sh"})
	assert.DirExists(t, idleDir)

	var raw map[string]any
	e.mustCall("deleteSessionDirs", map[string]any{"names": []string{}}, &raw)
	assert.Equal(t, map[string]any{"deleted": []any{}, "errors": map[string]any{}}, raw)
}

func TestPruneSessionCaches(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "busy", "name": "busy", "command": "sh"})
	_ = g
	dir := filepath.Join(e.s.sessionsDir)
	writeFile(t, filepath.Join(dir, "busy", ".cache", "x"), 100)
	writeFile(t, filepath.Join(dir, "idle", ".cache", "x"), 100)
	writeFile(t, filepath.Join(dir, "idle", ".cache", "y", "z"), 50)
	writeFile(t, filepath.Join(dir, "idle", "tmp", "old"), 7)
	writeFile(t, filepath.Join(dir, "idle", "tmp", "new"), 9)
	writeFile(t, filepath.Join(dir, "idle", "keep"), 1)
	writeFile(t, filepath.Join(dir, "clean", "keep"), 1)
	old := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(filepath.Join(dir, "idle", "tmp", "old"), old, old))

	// Plenty of free space: nothing happens, but the shape is complete.
	var raw map[string]any
	e.mustCall("pruneSessionCaches", map[string]any{"onlyIfFreeBytesBelow": 1}, &raw)
	assert.Equal(t, map[string]any{"prunedSessions": []any{}, "skippedSessions": []any{}, "freedBytes": float64(0), "errors": map[string]any{}}, raw)
	assert.FileExists(t, filepath.Join(dir, "idle", ".cache", "x"))

	var r protocol.PruneResult
	e.mustCall("pruneSessionCaches", map[string]any{"onlyIfFreeBytesBelow": 0, "includeSessionTmp": true, "sessionTmpOlderThanSeconds": 3600}, &r)
	assert.Equal(t, []string{"idle"}, r.PrunedSessions)
	assert.Equal(t, []string{"busy"}, r.SkippedSessions)
	assert.Empty(t, r.Errors)
	assert.GreaterOrEqual(t, r.FreedBytes, int64(157))
	assert.NoDirExists(t, filepath.Join(dir, "idle", ".cache"))
	assert.NoFileExists(t, filepath.Join(dir, "idle", "tmp", "old"))
	assert.FileExists(t, filepath.Join(dir, "idle", "tmp", "new"))
	assert.FileExists(t, filepath.Join(dir, "idle", "keep"))
	assert.FileExists(t, filepath.Join(dir, "busy", ".cache", "x"))

	b, err := json.Marshal(r)
	require.NoError(t, err)
	assert.JSONEq(t, `{"prunedSessions":["idle"],"skippedSessions":["busy"],"freedBytes":`+jsonInt(r.FreedBytes)+`,"errors":{}}`, string(b))
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }
