package helper

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A skeleton reached through a symlink (the host's own: trusted) is
// copied; a home that is a symlink is refused, nothing written through it.
func TestCopySkeletonSymlinks(t *testing.T) {
	skel, home, outside := t.TempDir(), t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(skel, ".profile"), []byte("p"), 0o644))
	link := filepath.Join(t.TempDir(), "skel")
	require.NoError(t, os.Symlink(skel, link))
	require.NoError(t, copySkeleton(link, home))
	assert.FileExists(t, filepath.Join(home, ".profile"))

	planted := filepath.Join(t.TempDir(), "home")
	require.NoError(t, os.Symlink(outside, planted))
	require.Error(t, copySkeleton(skel, planted))
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries)

	require.NoError(t, copySkeleton(filepath.Join(t.TempDir(), "none"), home), "no skeleton, nothing to copy")
}

// A skeleton is copied up to maxSkelEntries entries (a directory's first
// ones; past them in a subdirectory, with an error), a file up to
// maxSkelFileBytes.
func TestCopySkeletonBounds(t *testing.T) {
	skel, home := t.TempDir(), t.TempDir()
	for i := range maxSkelEntries + 1 {
		require.NoError(t, os.WriteFile(filepath.Join(skel, strconv.Itoa(i)), nil, 0o644))
	}
	require.NoError(t, copySkeleton(skel, home))
	entries, err := os.ReadDir(home)
	require.NoError(t, err)
	assert.Len(t, entries, maxSkelEntries)

	skel, home = t.TempDir(), t.TempDir()
	for i := range maxSkelEntries {
		require.NoError(t, os.MkdirAll(filepath.Join(skel, "d"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(skel, "d", strconv.Itoa(i)), nil, 0o644))
	}
	require.ErrorContains(t, copySkeleton(skel, home), "more than the entries")
	entries, err = os.ReadDir(filepath.Join(home, "d"))
	require.NoError(t, err)
	assert.Len(t, entries, maxSkelEntries-1, "the directory itself counts")

	skel, home = t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(skel, "big"), make([]byte, maxSkelFileBytes+10), 0o644))
	require.NoError(t, copySkeleton(skel, home))
	fi, err := os.Stat(filepath.Join(home, "big"))
	require.NoError(t, err)
	assert.Equal(t, int64(maxSkelFileBytes), fi.Size())
}
