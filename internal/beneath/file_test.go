package beneath

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestReadFile(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, os.WriteFile(filepath.Join(f.root, "a", "b", "text"), []byte("hello"), 0o600))
	d := openT(t, f.root)

	got, err := d.ReadFile("a/b/text", 5)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	got, err = d.ReadFile("file", 100)
	require.NoError(t, err)
	assert.Len(t, got, 3)

	_, err = d.ReadFile("a/b/text", 4)
	assert.ErrorIs(t, err, ErrTooLarge)
	for _, rel := range []string{"a/out/precious", "a/b/out", "out/precious", "a/in/file", "a/b/dangles"} {
		_, err := d.ReadFile(rel, 1<<31)
		assert.ErrorIs(t, err, syscall.ELOOP, "%s: a symlink at any component is refused", rel)
	}
	_, err = d.ReadFile("a/../../"+filepath.Base(f.root)+"/file", 100)
	assert.ErrorIs(t, err, syscall.EXDEV, "no way out of the directory")
	for _, rel := range []string{"", "/etc/passwd"} {
		_, err := d.ReadFile(rel, 100)
		assert.ErrorIs(t, err, ErrBadName, rel)
	}
	_, err = d.ReadFile("a", 100)
	assert.ErrorIs(t, err, ErrNotRegular, "a directory")
	_, err = d.ReadFile("missing", 100)
	assert.ErrorIs(t, err, os.ErrNotExist)
	f.assertOutsideIntact(t)
}

// A FIFO neither blocks the open nor is read.
func TestReadFileRefusesAFIFO(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	_, err := openT(t, dir).ReadFile("fifo", 100)
	assert.ErrorIs(t, err, ErrNotRegular)
}

// OpenFile opens what ReadFile reads, with its fstat, and refuses what
// ReadFile refuses.
func TestOpenFile(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	file, st, err := d.OpenFile("a/b/file")
	require.NoError(t, err)
	assert.Equal(t, int64(10), st.Size)
	require.NoError(t, file.Close())
	_, _, err = d.OpenFile("a/b/out")
	assert.ErrorIs(t, err, syscall.ELOOP, "a symlink is not followed")
	_, _, err = d.OpenFile("a")
	assert.ErrorIs(t, err, ErrNotRegular)
}

// Remove unlinks a file or a symlink itself (never its target) and
// refuses directories and what is not one entry name.
func TestRemove(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	require.NoError(t, d.Remove("file"))
	assert.NoFileExists(t, filepath.Join(f.root, "file"))
	require.NoError(t, d.Remove("out"))
	f.assertOutsideIntact(t)
	assert.ErrorIs(t, d.Remove("a"), syscall.EISDIR)
	for _, name := range []string{"", ".", "..", "a/b/file"} {
		assert.ErrorIs(t, d.Remove(name), ErrBadName, name)
	}
	assert.FileExists(t, filepath.Join(f.root, "a", "b", "file"))
	assert.ErrorIs(t, d.Remove("missing"), os.ErrNotExist)
}
