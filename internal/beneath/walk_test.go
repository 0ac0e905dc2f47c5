package beneath

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// swapOnDescend makes the walk find the directory victim replaced by a
// symlink to target just before it opens it, as a racing guest would.
func swapOnDescend(t *testing.T, victim, target string) {
	t.Cleanup(func() { beforeDescend = func(*Dir, string) {} })
	beforeDescend = func(d *Dir, name string) {
		if filepath.Join(d.path, name) != victim {
			return
		}
		require.NoError(t, os.Rename(victim, victim+".aside"))
		require.NoError(t, os.Symlink(target, victim))
	}
}

// lowerVisits sets maxVisits for one test.
func lowerVisits(t *testing.T, n int) {
	saved := maxVisits
	maxVisits = n
	t.Cleanup(func() { maxVisits = saved })
}

// chain makes n nested directories "d" in dir, each holding a 1-byte file,
// through descriptors (so n may pass PATH_MAX).
func chain(t *testing.T, dir string, n int) {
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	for range n {
		require.NoError(t, unix.Mkdirat(fd, "d", 0o755))
		next, err := unix.Openat(fd, "d", unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		require.NoError(t, unix.Close(fd))
		fd = next
		f, err := unix.Openat(fd, "f", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		require.NoError(t, err)
		_, err = unix.Write(f, []byte{1})
		require.NoError(t, err)
		require.NoError(t, unix.Close(f))
	}
	require.NoError(t, unix.Close(fd))
}

func TestRemoveAllTree(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	for _, name := range []string{"a", "file", "out"} {
		require.NoError(t, d.RemoveAll(name), name)
	}
	entries, err := d.Entries(10)
	require.NoError(t, err)
	assert.Empty(t, entries)
	f.assertOutsideIntact(t)
	assert.DirExists(t, f.outside)
}

func TestRemoveAllSymlinkItself(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, openT(t, f.root).RemoveAll("out"))
	assert.NoFileExists(t, filepath.Join(f.root, "out"))
	assert.DirExists(t, filepath.Join(f.root, "a"))
	f.assertOutsideIntact(t)
}

func TestRemoveAllMissingAndBadNames(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	assert.NoError(t, d.RemoveAll("missing"))
	for _, bad := range []string{"", ".", "..", "a/b", "out/precious"} {
		assert.ErrorIs(t, d.RemoveAll(bad), ErrBadName, bad)
	}
	f.assertOutsideIntact(t)
	assert.FileExists(t, filepath.Join(f.root, "a", "b", "file"))
}

func TestRemoveAllDirectorySwappedForSymlink(t *testing.T) {
	for _, victim := range []string{"a", "a/b"} {
		t.Run(victim, func(t *testing.T) {
			f := newFixture(t)
			swapOnDescend(t, filepath.Join(f.root, victim), f.outside)
			err := openT(t, f.root).RemoveAll("a")
			assert.ErrorIs(t, err, unix.ENOTDIR, "openat2 refuses the symlink")
			f.assertOutsideIntact(t)
			assert.DirExists(t, filepath.Join(f.root, victim+".aside"))
		})
	}
}

func TestRemoveAllDepth(t *testing.T) {
	fits := t.TempDir()
	chain(t, fits, MaxDepth)
	require.NoError(t, openT(t, fits).RemoveAll("d"))
	assert.NoDirExists(t, filepath.Join(fits, "d"))

	deep := t.TempDir()
	chain(t, deep, MaxDepth+1)
	assert.ErrorIs(t, openT(t, deep).RemoveAll("d"), ErrTooDeep)
	assert.DirExists(t, filepath.Join(deep, "d"))
}

func TestRemoveAllVeryDeep(t *testing.T) {
	dir := t.TempDir()
	chain(t, dir, 8*MaxDepth)
	d := openT(t, dir)
	want := dirSizes(t, dir, MaxDepth+1) + MaxDepth // the directories it stats, a byte for each it opens
	assert.Equal(t, want, d.SizeOf("d"))
	assert.ErrorIs(t, d.RemoveAll("d"), ErrTooDeep)
	assert.NoFileExists(t, filepath.Join(dir, "d", "f"), "what it reached is removed")
}

func TestRemoveAllEntryLimit(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"1", "2", "3", "4", "5", "6"} {
		writeFile(t, filepath.Join(dir, "big", n), 1)
	}
	lowerVisits(t, 4)
	d := openT(t, dir)
	assert.ErrorIs(t, d.RemoveAll("big"), ErrTooMany)
	assert.DirExists(t, filepath.Join(dir, "big"))
	require.NoError(t, d.RemoveAll("big"), "a later call goes on")
	require.NoError(t, d.RemoveAll("big"))
	assert.NoDirExists(t, filepath.Join(dir, "big"))
}

func TestSizeOf(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	assert.Equal(t, int64(3), d.SizeOf("file"))
	assert.Equal(t, int64(len(f.outside)), d.SizeOf("out"), "a symlink counts as itself")
	want := lstatSize(t, f.root, "a", "a/b", "a/b/file", "a/out", "a/in", "a/b/out", "a/b/dangles")
	assert.Equal(t, want, d.SizeOf("a"))
	assert.Zero(t, d.SizeOf("missing"))
	assert.Zero(t, d.SizeOf("a/b"), "not a single name")
}

func TestSizeOfDirectorySwappedForSymlink(t *testing.T) {
	f := newFixture(t)
	swapOnDescend(t, filepath.Join(f.root, "a", "b"), f.outside)
	got := openT(t, f.root).SizeOf("a")
	assert.Less(t, got, int64(1<<30), "the outside directory is not counted")
	assert.Positive(t, got)
	f.assertOutsideIntact(t)
}

func TestSizeOfStaysOnItsFilesystem(t *testing.T) {
	root, err := os.Lstat("/")
	require.NoError(t, err)
	proc, err := os.Lstat("/proc")
	if err != nil || sameDev(root, proc) {
		t.Skip("/proc is not a filesystem of its own here")
	}
	assert.Zero(t, openT(t, "/").SizeOf("proc"))
}

func TestSizeOfEntryLimit(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"1", "2", "3", "4", "5", "6"} {
		writeFile(t, filepath.Join(dir, "big", n), 100)
	}
	lowerVisits(t, 4)
	got := openT(t, dir).SizeOf("big") - lstatSize(t, dir, "big")
	assert.Equal(t, int64(300), got, "the directory and three files of the six")
}

// lstatSize sums the Lstat sizes of the entries rels of root.
func lstatSize(t *testing.T, root string, rels ...string) int64 {
	var total int64
	for _, rel := range rels {
		fi, err := os.Lstat(filepath.Join(root, rel))
		require.NoError(t, err)
		total += fi.Size()
	}
	return total
}

// dirSizes sums the sizes of the first n directories of a chain in dir.
func dirSizes(t *testing.T, dir string, n int) int64 {
	return lstatSize(t, dir, chainPaths(n)...)
}

func chainPaths(n int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, strings.Repeat("d/", i))
	}
	return out
}

func sameDev(a, b os.FileInfo) bool {
	return a.Sys().(*syscall.Stat_t).Dev == b.Sys().(*syscall.Stat_t).Dev
}
