package virtiofs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// hostPerm is a host path's permission bits with the set-id and sticky
// bits.
func hostPerm(t *testing.T, path string) uint32 {
	t.Helper()
	return lstat(t, path).Mode & 0o7777
}

// Set-user-ID and set-group-ID bits never come from the guest: CREATE,
// MKDIR, MKNOD and SETATTR drop them (the sticky bit stays), and the reply
// shows the mode the host file got.
func TestSetIDBitsNeverComeFromTheGuest(t *testing.T) {
	defer syscall.Umask(syscall.Umask(0o022))
	r := newRig(t, Options{})
	dir := r.export(t, "rw", false, map[string]string{"plain": "x", "d/x": ""})
	r.initSession(t)
	root := r.walk(t, "rw")

	c, errno := r.create(t, root, "created", syscall.O_RDWR, syscall.S_IFREG|0o6755)
	require.Zero(t, errno)
	require.Equal(t, uint32(0o755), hostPerm(t, filepath.Join(dir, "created")), "CREATE")
	require.Equal(t, uint32(syscall.S_IFREG|0o755), c.Attr.Mode, "the reply shows the host's mode")

	m, errno := r.mkdir(t, root, "made", 0o3755)
	require.Zero(t, errno)
	require.Equal(t, uint32(0o1755), hostPerm(t, filepath.Join(dir, "made")), "MKDIR keeps the sticky bit, drops set-gid")
	require.Equal(t, uint32(syscall.S_IFDIR|0o1755), m.Attr.Mode)
	_, errno = r.mkdir(t, root, "made-suid", 0o4777)
	require.Zero(t, errno)
	require.Equal(t, uint32(0o755), hostPerm(t, filepath.Join(dir, "made-suid")))

	n, errno := r.mknod(t, root, "node", syscall.S_IFREG|0o6755, 0)
	require.Zero(t, errno)
	require.Equal(t, uint32(0o755), hostPerm(t, filepath.Join(dir, "node")), "MKNOD of a regular file")
	require.Equal(t, uint32(syscall.S_IFREG|0o755), n.Attr.Mode)
	_, errno = r.mknod(t, root, "fifo", syscall.S_IFIFO|0o6644, 0)
	require.Zero(t, errno)
	require.Equal(t, uint32(0o644), hostPerm(t, filepath.Join(dir, "fifo")), "MKNOD of a FIFO")

	plain := r.walk(t, "rw", "plain")
	for _, mode := range []uint32{0o6755, 0o4755, 0o2755, 0o2645} {
		a, errno := r.setattr(t, plain, setattrIn{Valid: fuse.FATTR_MODE, Mode: mode})
		require.Zero(t, errno)
		require.Equal(t, mode&0o777, hostPerm(t, filepath.Join(dir, "plain")), "SETATTR mode %o", mode)
		require.Equal(t, syscall.S_IFREG|mode&0o777, a.Attr.Mode)
	}
	d := r.walk(t, "rw", "d")
	_, errno = r.setattr(t, d, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o3775})
	require.Zero(t, errno)
	require.Equal(t, uint32(0o1775), hostPerm(t, filepath.Join(dir, "d")), "SETATTR of a directory")
}

// A set-id file on the host loses its set-user-ID bit (and its set-group-ID
// bit when group-executable) before the guest writes or truncates it, as
// Linux does for a writer without CAP_FSETID: the guest cannot leave a
// privileged program modified on the host.
func TestWriteAndTruncateClearSetIDBitsOnTheHost(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "rw", false, map[string]string{
		"suid": "#!", "sgid": "#!", "sgid-noexec": "#!", "both": "#!", "trunc": "#!", "otrunc": "#!", "untouched": "#!",
	})
	for name, mode := range map[string]os.FileMode{
		"suid": 0o755 | os.ModeSetuid, "sgid": 0o755 | os.ModeSetgid, "sgid-noexec": 0o644 | os.ModeSetgid,
		"both": 0o755 | os.ModeSetuid | os.ModeSetgid, "trunc": 0o755 | os.ModeSetuid | os.ModeSetgid,
		"otrunc": 0o755 | os.ModeSetuid, "untouched": 0o755 | os.ModeSetuid,
	} {
		require.NoError(t, os.Chmod(filepath.Join(dir, name), mode))
	}
	r.initSession(t)
	path := func(name string) string { return filepath.Join(dir, name) }

	for _, name := range []string{"suid", "sgid", "sgid-noexec", "both"} {
		f := r.walk(t, "rw", name)
		fh, errno := r.open(t, f, syscall.O_WRONLY)
		require.Zero(t, errno)
		_, errno = r.write(t, f, fh, 0, []byte("#!/bin/sh\n"))
		require.Zero(t, errno)
		a, errno := r.getattr(t, f)
		require.Zero(t, errno)
		require.Equal(t, hostPerm(t, path(name)), a.Attr.Mode&0o7777, "%s: the guest sees the host's mode", name)
	}
	require.Equal(t, uint32(0o755), hostPerm(t, path("suid")), "WRITE clears set-uid")
	require.Equal(t, uint32(0o755), hostPerm(t, path("sgid")), "WRITE clears set-gid of a group-executable file")
	require.Equal(t, uint32(0o2644), hostPerm(t, path("sgid-noexec")), "set-gid without group execute is no privilege: kept")
	require.Equal(t, uint32(0o755), hostPerm(t, path("both")))

	_, errno := r.setattr(t, r.walk(t, "rw", "trunc"), setattrIn{Valid: fuse.FATTR_SIZE, Size: 0})
	require.Zero(t, errno)
	require.Equal(t, uint32(0o755), hostPerm(t, path("trunc")), "SETATTR size clears both")

	_, errno = r.open(t, r.walk(t, "rw", "otrunc"), syscall.O_WRONLY|syscall.O_TRUNC)
	require.Zero(t, errno)
	require.Equal(t, uint32(0o755), hostPerm(t, path("otrunc")), "OPEN with O_TRUNC clears set-uid")

	// Reading, and opening for writing without writing, change nothing.
	u := r.walk(t, "rw", "untouched")
	fh, errno := r.open(t, u, syscall.O_RDONLY)
	require.Zero(t, errno)
	_, errno = r.read(t, u, fh, 0, 10)
	require.Zero(t, errno)
	_, errno = r.open(t, u, syscall.O_RDWR)
	require.Zero(t, errno)
	require.Equal(t, uint32(0o4755), hostPerm(t, path("untouched")))
}
