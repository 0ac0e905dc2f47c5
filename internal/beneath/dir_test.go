package beneath

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// writeFile makes the file p (and its parents) of size bytes (sparse).
func writeFile(t *testing.T, p string, size int64) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, nil, 0o644))
	require.NoError(t, os.Truncate(p, size))
}

// openT opens dir with Open and closes it when the test ends.
func openT(t *testing.T, dir string) *Dir {
	t.Helper()
	d, err := Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// fixture is a tree beneath root and a directory outside it that symlinks
// in the tree point to.
type fixture struct {
	root, outside string
}

func newFixture(t *testing.T) fixture {
	f := fixture{root: t.TempDir(), outside: t.TempDir()}
	writeFile(t, filepath.Join(f.outside, "precious"), 1<<30)
	writeFile(t, filepath.Join(f.root, "a", "b", "file"), 10)
	writeFile(t, filepath.Join(f.root, "file"), 3)
	for link, target := range map[string]string{
		"out":         f.outside,
		"a/out":       f.outside,
		"a/b/out":     filepath.Join(f.outside, "precious"),
		"a/in":        "b",
		"a/b/dangles": "nowhere",
	} {
		require.NoError(t, os.Symlink(target, filepath.Join(f.root, link)))
	}
	return f
}

// assertOutsideIntact checks that nothing outside the tree was touched.
func (f fixture) assertOutsideIntact(t *testing.T) {
	t.Helper()
	fi, err := os.Stat(filepath.Join(f.outside, "precious"))
	require.NoError(t, err, "the file outside was removed")
	assert.Equal(t, int64(1<<30), fi.Size())
}

func TestOpenDir(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	for _, tc := range []struct {
		rel  string
		want error
	}{
		{"a", nil},
		{"a/b", nil},
		{"out", unix.ENOTDIR},   // symlink out, as the last component
		{"a/in", unix.ENOTDIR},  // symlink inside, as the last component
		{"a/in/.", unix.ELOOP},  // ... as a middle one
		{"out/.", unix.ELOOP},   // symlink out, in the middle
		{"file", unix.ENOTDIR},  // not a directory
		{"../x", unix.EXDEV},    // out of d
		{"a/../..", unix.EXDEV}, // out of d, less plainly
		{"missing", unix.ENOENT},
		{"/etc", ErrBadName},
		{"", ErrBadName},
	} {
		sub, err := d.OpenDir(tc.rel)
		if tc.want == nil {
			require.NoError(t, err, tc.rel)
			require.NoError(t, sub.Close())
			continue
		}
		assert.ErrorIs(t, err, tc.want, tc.rel)
		assert.Contains(t, err.Error(), tc.rel, "the error names the path")
	}
}

func TestOpenRefusesASymlink(t *testing.T) {
	f := newFixture(t)
	_, err := Open(filepath.Join(f.root, "out"))
	assert.ErrorIs(t, err, unix.ENOTDIR)
	_, err = Open(filepath.Join(f.root, "file"))
	assert.ErrorIs(t, err, unix.ENOTDIR)
}

func TestStat(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	e, err := d.Stat("out")
	require.NoError(t, err)
	assert.Equal(t, uint32(unix.S_IFLNK), e.Stat.Mode&unix.S_IFMT, "the symlink itself")
	assert.False(t, e.IsDir())
	e, err = d.Stat("a")
	require.NoError(t, err)
	assert.True(t, e.IsDir())
	_, err = d.Stat("missing")
	assert.ErrorIs(t, err, fs.ErrNotExist)
	for _, bad := range []string{"", ".", "..", "a/b", "out/precious"} {
		_, err := d.Stat(bad)
		assert.ErrorIs(t, err, ErrBadName, bad)
	}
}

func TestMkdir(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	require.NoError(t, d.Mkdir("new", 0o700))
	assert.DirExists(t, filepath.Join(f.root, "new"))
	assert.ErrorIs(t, d.Mkdir("new", 0o700), fs.ErrExist)
	assert.ErrorIs(t, d.Mkdir("out", 0o700), fs.ErrExist, "a symlink is not followed")
	assert.ErrorIs(t, d.Mkdir("out/x", 0o700), ErrBadName)
	assert.NoDirExists(t, filepath.Join(f.outside, "x"))
}

func TestStatfs(t *testing.T) {
	st, err := openT(t, t.TempDir()).Statfs()
	require.NoError(t, err)
	assert.Positive(t, st.Blocks)
}

func TestEntries(t *testing.T) {
	f := newFixture(t)
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	require.NoError(t, os.Chtimes(filepath.Join(f.root, "file"), old, old))
	entries, err := openT(t, f.root).Entries(100)
	require.NoError(t, err)
	byName := map[string]Entry{}
	for _, e := range entries {
		byName[e.Name] = e
	}
	assert.ElementsMatch(t, []string{"a", "file", "out"}, slices.Collect(maps.Keys(byName)))
	assert.True(t, byName["a"].IsDir())
	assert.False(t, byName["out"].IsDir(), "a symlink to a directory is no directory")
	assert.Equal(t, int64(len(f.outside)), byName["out"].Stat.Size, "the symlink's own size")
	assert.Equal(t, int64(3), byName["file"].Stat.Size)
	assert.True(t, old.Equal(byName["file"].ModTime()))
}

func TestEntriesAtMostMax(t *testing.T) {
	dir := t.TempDir()
	for i := range 3 * batchNames {
		writeFile(t, filepath.Join(dir, strconv.Itoa(i)), 0)
	}
	d := openT(t, dir)
	some, err := d.Entries(batchNames + 1)
	require.NoError(t, err)
	assert.Len(t, some, batchNames+1)
	all, err := d.Entries(10 * batchNames)
	require.NoError(t, err)
	assert.Len(t, all, 3*batchNames, "each call lists from the start")
	none, err := d.Entries(0)
	require.NoError(t, err)
	assert.Empty(t, none)
}
