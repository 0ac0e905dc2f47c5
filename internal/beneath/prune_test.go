package beneath

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// age sets path's modification time to d ago (not following a symlink's).
func age(t *testing.T, path string, d time.Duration) {
	t.Helper()
	when := time.Now().Add(-d)
	require.NoError(t, os.Chtimes(path, when, when))
}

func TestPruneOlderRemovesOnlyOldEntries(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "precious"), []byte("keep"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "old-tree", "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "old-tree", "sub", "f"), make([]byte, 3000), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "old-file"), make([]byte, 500), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "new-file"), []byte("new"), 0o644))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "old-link")))
	age(t, filepath.Join(dir, "old-tree"), 2*time.Hour)
	age(t, filepath.Join(dir, "old-file"), 2*time.Hour)
	cutoff := time.Now().Add(-time.Hour) // old-link and new-file are newer

	d, err := Open(dir)
	require.NoError(t, err)
	defer d.Close()
	r := d.PruneOlder(cutoff, 100)
	assert.Empty(t, r.Errs)
	assert.Equal(t, 2, r.Tried, "old-tree and old-file; the link and new-file are newer than the cutoff")
	assert.GreaterOrEqual(t, r.Freed, int64(3500))
	assert.NoFileExists(t, filepath.Join(dir, "old-file"))
	assert.NoDirExists(t, filepath.Join(dir, "old-tree"))
	assert.FileExists(t, filepath.Join(dir, "new-file"))

	// Everything older than now: the symlink goes as itself, its target stays.
	r = d.PruneOlder(time.Now().Add(time.Second), 100)
	assert.Empty(t, r.Errs)
	assert.Equal(t, 2, r.Tried)
	_, err = os.Lstat(filepath.Join(dir, "old-link"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.FileExists(t, filepath.Join(outside, "precious"))
}

func TestPruneOlderLooksAtMostMax(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b", "c", "d"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), nil, 0o644))
	}
	d, err := Open(dir)
	require.NoError(t, err)
	defer d.Close()
	r := d.PruneOlder(time.Now().Add(time.Second), 3)
	assert.Equal(t, 3, r.Tried)
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, left, 1, "the fourth entry waits for the next call")
}

func TestPrunedAdd(t *testing.T) {
	r := Pruned{Freed: 1, Tried: 1}
	r.Add(Pruned{Freed: 2, Tried: 3, Errs: []error{os.ErrPermission}})
	assert.Equal(t, Pruned{Freed: 3, Tried: 4, Errs: []error{os.ErrPermission}}, r)
	assert.True(t, r.RemovedAny())
	assert.ErrorIs(t, r.Err(), os.ErrPermission)
	failed := Pruned{Tried: 1, Errs: []error{os.ErrPermission}}
	assert.False(t, failed.RemovedAny(), "its one try failed")
	assert.NoError(t, Pruned{}.Err())
}
