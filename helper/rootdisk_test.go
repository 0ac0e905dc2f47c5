package helper

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPrepareRootDisk: the disk is made sparse at the size asked for
// (whole MiB, at least the minimum), grown when a larger size is asked,
// never shrunk (the guest's file system fills it), and a path that is
// not a regular file is refused.
func TestPrepareRootDisk(t *testing.T) {
	path := filepath.Join(t.TempDir(), "profiles", "p", rootDiskFile)
	require.NoError(t, prepareRootDisk(path, 200<<20+1))
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, int64(201<<20), st.Size(), "rounded up to a whole MiB")
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.Less(t, blocksOf(t, path), int64(1<<20), "sparse: no data written")

	require.NoError(t, prepareRootDisk(path, 1<<30))
	st, _ = os.Stat(path)
	assert.Equal(t, int64(1<<30), st.Size(), "grown")
	require.NoError(t, prepareRootDisk(path, 100<<20))
	st, _ = os.Stat(path)
	assert.Equal(t, int64(1<<30), st.Size(), "never shrunk")

	small := filepath.Join(t.TempDir(), rootDiskFile)
	require.NoError(t, prepareRootDisk(small, 1))
	st, _ = os.Stat(small)
	assert.Equal(t, int64(minRootDiskBytes), st.Size())

	dir := filepath.Join(t.TempDir(), rootDiskFile)
	require.NoError(t, os.Mkdir(dir, 0o700))
	assert.Error(t, prepareRootDisk(dir, 1<<30))
	link := filepath.Join(t.TempDir(), rootDiskFile)
	require.NoError(t, os.Symlink(path, link))
	assert.Error(t, prepareRootDisk(link, 1<<30), "a symlink is not followed")
}

// blocksOf is the bytes a file's allocated blocks hold.
func blocksOf(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return st.Blocks * 512
}
