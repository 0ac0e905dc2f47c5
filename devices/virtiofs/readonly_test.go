package virtiofs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// Each mutation on a read-only export, one at a time: EROFS, and the host
// directory exactly as it was (names, types, modes, sizes, times,
// contents).
func TestReadOnlyExportRefusesEachMutationAlone(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "ro", true, map[string]string{"f": "keep", "d/g": "keep too", "d/empty/.keep": ""})
	require.NoError(t, os.Symlink("f", filepath.Join(dir, "lnk")))
	r.initSession(t)
	root := r.walk(t, "ro")
	d := r.walk(t, "ro", "d")
	f := r.walk(t, "ro", "f")
	g := r.walk(t, "ro", "d", "g")
	lnk := r.walk(t, "ro", "lnk")
	rofh, errno := r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	before := snapshot(t, dir)

	for name, op := range map[string]func() syscall.Errno{
		"create":        func() syscall.Errno { _, e := r.create(t, root, "new", syscall.O_RDWR, 0o644); return e },
		"create-in-sub": func() syscall.Errno { _, e := r.create(t, d, "new", syscall.O_WRONLY, 0o644); return e },
		"mkdir":         func() syscall.Errno { _, e := r.mkdir(t, d, "new", 0o755); return e },
		"mknod-fifo":    func() syscall.Errno { _, e := r.mknod(t, root, "new", syscall.S_IFIFO|0o644, 0); return e },
		"mknod-reg":     func() syscall.Errno { _, e := r.mknod(t, root, "new", syscall.S_IFREG|0o644, 0); return e },
		"symlink":       func() syscall.Errno { _, e := r.symlink(t, root, "new", "f"); return e },
		"link":          func() syscall.Errno { _, e := r.link(t, g, root, "new"); return e },
		"unlink":        func() syscall.Errno { return r.unlink(t, root, "f") },
		"unlink-link":   func() syscall.Errno { return r.unlink(t, root, "lnk") },
		"rmdir":         func() syscall.Errno { return r.rmdir(t, d, "empty") },
		"rename":        func() syscall.Errno { return r.rename(t, root, "f", d, "moved") },
		"rename-over":   func() syscall.Errno { return r.rename(t, d, "g", root, "f") },
		"truncate":      func() syscall.Errno { _, e := r.setattr(t, f, setattrIn{Valid: fuse.FATTR_SIZE}); return e },
		"chmod": func() syscall.Errno {
			_, e := r.setattr(t, f, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o777})
			return e
		},
		"chmod-dir": func() syscall.Errno {
			_, e := r.setattr(t, d, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o777})
			return e
		},
		"chown": func() syscall.Errno {
			_, e := r.setattr(t, f, setattrIn{Valid: fuse.FATTR_UID | fuse.FATTR_GID, Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())})
			return e
		},
		"utimes": func() syscall.Errno { _, e := r.setattr(t, f, setattrIn{Valid: fuse.FATTR_MTIME, Mtime: 1}); return e },
		"utimes-now": func() syscall.Errno {
			_, e := r.setattr(t, f, setattrIn{Valid: fuse.FATTR_ATIME | fuse.FATTR_ATIME_NOW})
			return e
		},
		"utimes-link": func() syscall.Errno {
			_, e := r.setattr(t, lnk, setattrIn{Valid: fuse.FATTR_MTIME, Mtime: 1})
			return e
		},
		"open-wronly": func() syscall.Errno { _, e := r.open(t, f, syscall.O_WRONLY); return e },
		"open-rdwr":   func() syscall.Errno { _, e := r.open(t, g, syscall.O_RDWR); return e },
		"open-trunc":  func() syscall.Errno { _, e := r.open(t, f, syscall.O_RDONLY|syscall.O_TRUNC); return e },
		"open-append": func() syscall.Errno { _, e := r.open(t, f, syscall.O_WRONLY|syscall.O_APPEND); return e },
		"write-through-a-read-handle": func() syscall.Errno {
			_, e := r.write(t, f, rofh, 0, []byte("overwritten"))
			return e
		},
	} {
		require.Equal(t, syscall.EROFS, op(), name)
		require.Equal(t, before, snapshot(t, dir), "%s left the host as it was", name)
	}
	_, handles := r.dev.Counts()
	require.Equal(t, 1, handles, "no refused open or create holds a handle")

	// Reading goes on: data, listings with attributes, links, statfs.
	data, errno := r.read(t, f, rofh, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "keep", string(data))
	o, errno := r.opendir(t, root)
	require.Zero(t, errno)
	require.ElementsMatch(t, []string{".", "..", "d", "f", "lnk"}, names(r.listDir(t, root, o.Fh, opReaddirplus, 4096)))
	target, errno := r.readlink(t, lnk)
	require.Zero(t, errno)
	require.Equal(t, "f", target)
	_, errno = r.statfs(t, d)
	require.Zero(t, errno)
	require.Zero(t, r.fsync(t, f, rofh, opFsync), "FSYNC writes nothing")
	require.Equal(t, before, snapshot(t, dir))
}

// The same host directory exported read-only and read-write: two nodes for
// each inode, so the read-only one never becomes writable through the
// other, and a rename between them is refused.
func TestReadOnlyAndReadWriteExportsOfOneDirectory(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "rw", false, map[string]string{"f": "data"})
	require.NoError(t, r.exports.Add("ro", dir, true))
	r.initSession(t)
	rwF := r.walk(t, "rw", "f")
	roF := r.walk(t, "ro", "f")
	require.NotEqual(t, rwF, roF, "a node of a read-only export is never one of a read-write export")

	fh, errno := r.open(t, rwF, syscall.O_RDWR)
	require.Zero(t, errno)
	_, errno = r.write(t, rwF, fh, 0, []byte("DATA"))
	require.Zero(t, errno)
	_, errno = r.open(t, roF, syscall.O_RDWR)
	require.Equal(t, syscall.EROFS, errno)
	_, errno = r.setattr(t, roF, setattrIn{Valid: fuse.FATTR_SIZE})
	require.Equal(t, syscall.EROFS, errno)
	rofh, errno := r.open(t, roF, syscall.O_RDONLY)
	require.Zero(t, errno)
	data, errno := r.read(t, roF, rofh, 0, 10)
	require.Zero(t, errno)
	require.Equal(t, "DATA", string(data), "the same host file")

	require.Equal(t, syscall.EXDEV, r.rename(t, r.walk(t, "rw"), "f", r.walk(t, "ro"), "g"))
	_, errno = r.link(t, roF, r.walk(t, "rw"), "g")
	require.Equal(t, syscall.EXDEV, errno, "a hard link from the read-only export into the read-write one")
	require.NoFileExists(t, filepath.Join(dir, "g"))
}

// The export list (the root the guest mounts) is read-only too.
func TestExportListIsReadOnly(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"f": "x"})
	r.initSession(t)
	before := snapshot(t, r.dir)
	f := r.walk(t, "e1", "f")
	for name, errno := range map[string]syscall.Errno{
		"mkdir":   func() syscall.Errno { _, e := r.mkdir(t, fuse.FUSE_ROOT_ID, "new", 0o755); return e }(),
		"mknod":   func() syscall.Errno { _, e := r.mknod(t, fuse.FUSE_ROOT_ID, "new", syscall.S_IFIFO|0o644, 0); return e }(),
		"symlink": func() syscall.Errno { _, e := r.symlink(t, fuse.FUSE_ROOT_ID, "new", "e1"); return e }(),
		"link":    func() syscall.Errno { _, e := r.link(t, f, fuse.FUSE_ROOT_ID, "new"); return e }(),
		"create":  func() syscall.Errno { _, e := r.create(t, fuse.FUSE_ROOT_ID, "new", syscall.O_RDWR, 0o644); return e }(),
		"rename":  r.rename(t, fuse.FUSE_ROOT_ID, "e1", fuse.FUSE_ROOT_ID, "e2"),
		"unlink":  r.unlink(t, fuse.FUSE_ROOT_ID, "e1"),
		"rmdir":   r.rmdir(t, fuse.FUSE_ROOT_ID, "e1"),
		"setattr": func() syscall.Errno {
			_, e := r.setattr(t, fuse.FUSE_ROOT_ID, setattrIn{Valid: fuse.FATTR_MODE})
			return e
		}(),
	} {
		require.Equal(t, syscall.EROFS, errno, name)
	}
	require.Equal(t, before, snapshot(t, r.dir))
	require.Equal(t, []string{"e1"}, r.exports.Names())
}
