package beneath

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestOpenAt(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	for _, tc := range []struct {
		rel   string
		flags uint64
		want  error
	}{
		{"a/b/file", unix.O_RDONLY, nil},
		{"a/b", unix.O_PATH | unix.O_DIRECTORY, nil},
		{"a/in/file", unix.O_RDONLY, unix.ELOOP},    // symlink inside, in the middle
		{"out/precious", unix.O_RDONLY, unix.ELOOP}, // symlink out, in the middle
		{"a/b/out", unix.O_RDONLY, unix.ELOOP},      // symlink out, as the last component
		{"a/b/out", unix.O_PATH, unix.ELOOP},        // ... with O_PATH too
		{"out", unix.O_PATH | unix.O_DIRECTORY, unix.ELOOP},
		{"out", unix.O_DIRECTORY | unix.O_NOFOLLOW, unix.ENOTDIR},
		{"../x", unix.O_RDONLY, unix.EXDEV},
		{"a/../..", unix.O_PATH, unix.EXDEV},
		{"/proc/self/root", unix.O_PATH, ErrBadName},
		{"", unix.O_PATH, ErrBadName},
	} {
		fd, err := OpenAt(d.fd, tc.rel, unix.OpenHow{Flags: tc.flags})
		if tc.want == nil {
			require.NoError(t, err, tc.rel)
			flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
			require.NoError(t, err)
			assert.NotZero(t, flags&unix.FD_CLOEXEC, "%s: close-on-exec", tc.rel)
			unix.Close(fd)
			continue
		}
		assert.ErrorIs(t, err, tc.want, tc.rel)
	}
}

// O_PATH|O_NOFOLLOW opens a last-component symlink itself (the kernel's
// rule for RESOLVE_NO_SYMLINKS), never what it points to.
func TestOpenAtPathNoFollowHoldsTheLink(t *testing.T) {
	f := newFixture(t)
	fd, err := OpenAt(openT(t, f.root).fd, "a/b/out", unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW})
	require.NoError(t, err)
	defer unix.Close(fd)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	assert.Equal(t, uint32(unix.S_IFLNK), st.Mode&unix.S_IFMT)
}

func TestOpenEntryAt(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	fd, err := OpenEntryAt(d.fd, "a", unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY})
	require.NoError(t, err)
	unix.Close(fd)
	for _, bad := range []string{"a/b", ".", "..", ""} {
		_, err := OpenEntryAt(d.fd, bad, unix.OpenHow{Flags: unix.O_PATH})
		assert.ErrorIs(t, err, ErrBadName, bad)
	}
}

func TestCreateFile(t *testing.T) {
	f := newFixture(t)
	d := openT(t, f.root)
	out, err := d.CreateFile("new", 0o640)
	require.NoError(t, err)
	_, err = out.WriteString("x")
	require.NoError(t, err)
	require.NoError(t, out.Close())
	fi, err := os.Lstat(filepath.Join(f.root, "new"))
	require.NoError(t, err)
	assert.True(t, fi.Mode().IsRegular())
	assert.Equal(t, os.FileMode(0o640)&^umask(), fi.Mode().Perm())

	_, err = d.CreateFile("new", 0o600)
	assert.ErrorIs(t, err, unix.EEXIST, "an existing file is left as it is")
	_, err = d.CreateFile("a/b/out", 0o600)
	assert.ErrorIs(t, err, ErrBadName, "one entry only")
	_, err = d.CreateFile("out", 0o600)
	assert.ErrorIs(t, err, unix.EEXIST, "a symlink is not followed")
	f.assertOutsideIntact(t)
	assert.NoFileExists(t, filepath.Join(f.outside, "new"))
}

// umask reads the process's umask (and sets it back).
func umask() os.FileMode {
	m := unix.Umask(0)
	unix.Umask(m)
	return os.FileMode(m)
}

// The fallback for kernels without openat2 takes only what openat with
// O_NOFOLLOW resolves without leaving the directory.
func TestIsOneComponent(t *testing.T) {
	for rel, want := range map[string]bool{
		"name": true, ".": true, "..": false, "a/b": false, "a/": false, "../x": false,
	} {
		if got := isOneComponent(rel); got != want {
			t.Errorf("isOneComponent(%q) = %v, want %v", rel, got, want)
		}
	}
}
