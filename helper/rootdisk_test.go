package helper

import (
	"log/slog"
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
	path := filepath.Join(t.TempDir(), "profiles", "p", RootDiskFile)
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

	small := filepath.Join(t.TempDir(), RootDiskFile)
	require.NoError(t, prepareRootDisk(small, 1))
	st, _ = os.Stat(small)
	assert.Equal(t, int64(minRootDiskBytes), st.Size())

	dir := filepath.Join(t.TempDir(), RootDiskFile)
	require.NoError(t, os.Mkdir(dir, 0o700))
	assert.Error(t, prepareRootDisk(dir, 1<<30))
	link := filepath.Join(t.TempDir(), RootDiskFile)
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

// TestRootDiskIsLockedWhileOpen: a second open of a root disk in use (a
// second VM, or a second helper of the profile) fails, naming the file;
// once the first lets go, it works. Sizing the disk takes the lock too, so
// a disk in use is not resized under its VM. A symlink is not followed.
func TestRootDiskIsLockedWhileOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), RootDiskFile)
	require.NoError(t, prepareRootDisk(path, minRootDiskBytes))
	first, err := OpenRootDisk(path)
	require.NoError(t, err)

	_, err = OpenRootDisk(path)
	require.ErrorIs(t, err, ErrRootDiskInUse)
	assert.ErrorContains(t, err, path, "the error names the file")
	err = prepareRootDisk(path, 1<<30)
	require.ErrorIs(t, err, ErrRootDiskInUse)
	st, _ := os.Stat(path)
	assert.Equal(t, int64(minRootDiskBytes), st.Size(), "not grown under its VM")

	require.NoError(t, first.Close())
	again, err := OpenRootDisk(path)
	require.NoError(t, err, "free again once the first is closed")
	require.NoError(t, again.Close())

	link := filepath.Join(t.TempDir(), RootDiskFile)
	require.NoError(t, os.Symlink(path, link))
	_, err = OpenRootDisk(link)
	assert.ErrorIs(t, err, syscall.ELOOP, "a symlinked root disk is refused")
}

// TestRootDiskForInUse: a root disk another VM holds leaves the guest
// without one (its root read-only, logged), not failing its start.
func TestRootDiskForInUse(t *testing.T) {
	t.Setenv(RootDiskEnv, "")
	s := &Service{opts: Options{DataDir: t.TempDir()}, key: profileKey{name: "p"}, log: slog.New(slog.DiscardHandler), diskQuota: minRootDiskBytes}
	path := s.rootDiskPath()
	require.NoError(t, prepareRootDisk(path, minRootDiskBytes))
	held, err := OpenRootDisk(path)
	require.NoError(t, err)
	defer held.Close()
	vm := failingBackend{} // a VM backend: it attaches a root disk
	assert.Empty(t, s.rootDiskFor(vm), "no root disk: the guest's root is read-only")
	require.NoError(t, held.Close())
	assert.Equal(t, path, s.rootDiskFor(vm))
}
