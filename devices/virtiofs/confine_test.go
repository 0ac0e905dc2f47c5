package virtiofs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// outsideDir makes a directory beside the exports holding a secret, which
// no request may reach, and returns it.
func outsideDir(t *testing.T, r *rig) string {
	t.Helper()
	out := filepath.Join(r.dir, "outside")
	require.NoError(t, os.MkdirAll(out, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(out, "secret"), []byte("top secret"), 0o600))
	return out
}

// Every name a request carries is one ordinary path component: "..", ".",
// "", names with a slash (absolute or not) are refused by every operation
// that takes a name; a NUL ends a name, as in the kernel's strings.
func TestNamesThatLeaveADirectoryAreRefused(t *testing.T) {
	r := newRig(t, Options{})
	outside := outsideDir(t, r)
	dir := r.export(t, "x", false, map[string]string{"sub/a": "a", "f": "f"})
	r.initSession(t)
	root := r.walk(t, "x")
	sub := r.walk(t, "x", "sub")
	f := r.walk(t, "x", "f")
	hostBefore := snapshot(t, r.dir)

	bad := []string{"..", ".", "", "/", "/etc", "/etc/passwd", "a/b", "../outside", "../outside/secret",
		"sub/../../outside", "..\x00ignored", ".\x00", strings.Repeat("n", 256)}
	for _, name := range bad {
		want := syscall.EINVAL
		if len(name) > 255 {
			want = syscall.ENAMETOOLONG
		}
		for op, errno := range map[string]syscall.Errno{
			"lookup":      func() syscall.Errno { _, e := r.lookup(t, root, name); return e }(),
			"lookup-sub":  func() syscall.Errno { _, e := r.lookup(t, sub, name); return e }(),
			"mkdir":       func() syscall.Errno { _, e := r.mkdir(t, root, name, 0o755); return e }(),
			"create":      func() syscall.Errno { _, e := r.create(t, root, name, syscall.O_RDWR, 0o644); return e }(),
			"mknod":       func() syscall.Errno { _, e := r.mknod(t, root, name, syscall.S_IFIFO|0o644, 0); return e }(),
			"symlink":     func() syscall.Errno { _, e := r.symlink(t, root, name, "target"); return e }(),
			"link":        func() syscall.Errno { _, e := r.link(t, f, root, name); return e }(),
			"unlink":      r.unlink(t, sub, name),
			"rmdir":       r.rmdir(t, sub, name),
			"rename-from": r.rename(t, sub, name, root, "moved"),
			"rename-to":   r.rename(t, root, "f", sub, name),
		} {
			require.Equal(t, want, errno, "%s %q", op, name)
		}
	}
	_, errno := r.lookup(t, fuse.FUSE_ROOT_ID, "..")
	require.Equal(t, syscall.EINVAL, errno, "the export list has no parent")
	_, errno = r.lookup(t, fuse.FUSE_ROOT_ID, "x/sub")
	require.Equal(t, syscall.EINVAL, errno)
	require.Equal(t, hostBefore, snapshot(t, r.dir), "nothing made, moved or removed, in the export or beside it")
	b, err := os.ReadFile(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	require.Equal(t, "top secret", string(b))

	// A NUL ends the name: "sub\x00/../.." is "sub".
	e, errno := r.lookup(t, root, "sub\x00/../..")
	require.Zero(t, errno)
	require.Equal(t, sub, e.NodeId)
	_, err = os.Stat(filepath.Join(dir, "sub"))
	require.NoError(t, err)
}

// A symlink planted on the host pointing out of the export is reported as
// a symlink and never followed: not by LOOKUP beneath it, OPEN, OPENDIR,
// SETATTR, CREATE or MKDIR through it, nor a hard link to it.
func TestPlantedSymlinksAreReportedNeverFollowed(t *testing.T) {
	r := newRig(t, Options{})
	outside := outsideDir(t, r)
	dir := r.export(t, "x", false, map[string]string{"plain": "p"})
	secret := filepath.Join(outside, "secret")
	for name, target := range map[string]string{
		"abs": outside, "rel": "../outside", "absfile": secret, "relfile": "../outside/secret", "loop": "loop",
	} {
		require.NoError(t, os.Symlink(target, filepath.Join(dir, name)))
	}
	r.initSession(t)
	root := r.walk(t, "x")
	secretBefore := lstat(t, secret)

	for _, name := range []string{"abs", "rel", "absfile", "relfile", "loop"} {
		e, errno := r.lookup(t, root, name)
		require.Zero(t, errno, name)
		require.Equal(t, uint32(syscall.S_IFLNK), e.Attr.Mode&syscall.S_IFMT, "%s is reported as a symlink", name)
		host := lstat(t, filepath.Join(dir, name))
		require.EqualValues(t, host.Size, e.Attr.Size, "%s: the link's own attributes", name)
		target, errno := r.readlink(t, e.NodeId)
		require.Zero(t, errno)
		want, _ := os.Readlink(filepath.Join(dir, name))
		require.Equal(t, want, target, "the guest gets the link text, nothing more")

		_, errno = r.lookup(t, e.NodeId, "secret")
		require.Equal(t, syscall.ENOTDIR, errno, "%s: LOOKUP beneath a link", name)
		_, errno = r.open(t, e.NodeId, syscall.O_RDONLY)
		require.NotZero(t, errno, "%s: OPEN of a link", name)
		_, errno = r.open(t, e.NodeId, syscall.O_RDWR|syscall.O_TRUNC)
		require.NotZero(t, errno, "%s: OPEN O_TRUNC of a link", name)
		_, errno = r.opendir(t, e.NodeId)
		require.Equal(t, syscall.ENOTDIR, errno, "%s: OPENDIR of a link", name)
		_, errno = r.setattr(t, e.NodeId, setattrIn{Valid: fuse.FATTR_SIZE})
		require.Equal(t, syscall.EOPNOTSUPP, errno, "%s: truncate through a link", name)
		_, errno = r.setattr(t, e.NodeId, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o777})
		require.Equal(t, syscall.EOPNOTSUPP, errno, "%s: chmod through a link", name)
		_, errno = r.setattr(t, e.NodeId, setattrIn{Valid: fuse.FATTR_UID, Uid: uint32(os.Getuid())})
		require.Equal(t, syscall.EOPNOTSUPP, errno, "%s: chown through a link", name)
		_, errno = r.create(t, e.NodeId, "planted", syscall.O_RDWR, 0o644)
		require.Equal(t, syscall.ENOTDIR, errno, "%s: CREATE beneath a link", name)
		_, errno = r.mkdir(t, e.NodeId, "planted", 0o755)
		require.Equal(t, syscall.ENOTDIR, errno, "%s: MKDIR beneath a link", name)
		_, errno = r.symlink(t, e.NodeId, "planted", "x")
		require.Equal(t, syscall.ENOTDIR, errno, "%s: SYMLINK beneath a link", name)
		require.Equal(t, syscall.ENOTDIR, r.rename(t, root, "plain", e.NodeId, "planted"), "%s: RENAME into a link", name)
		_, errno = r.link(t, e.NodeId, root, "hard-"+name)
		require.Equal(t, syscall.EPERM, errno, "%s: no hard link to a link", name)
		_, errno = r.create(t, root, name, syscall.O_RDWR|syscall.O_TRUNC, 0o644)
		require.Equal(t, syscall.EEXIST, errno, "%s: CREATE over a link does not write through it", name)
		_, errno = r.mkdir(t, root, name, 0o755)
		require.Equal(t, syscall.EEXIST, errno, name)

		// Times of a link are the link's own (set by name, never
		// through it).
		_, errno = r.setattr(t, e.NodeId, setattrIn{Valid: fuse.FATTR_MTIME, Mtime: 12345})
		require.Zero(t, errno, name)
		require.EqualValues(t, 12345, lstat(t, filepath.Join(dir, name)).Mtim.Sec)
	}
	secretAfter := lstat(t, secret)
	require.Equal(t, secretBefore.Mode, secretAfter.Mode, "the secret's mode untouched")
	require.Equal(t, secretBefore.Mtim, secretAfter.Mtim, "the secret's times untouched")
	b, err := os.ReadFile(secret)
	require.NoError(t, err)
	require.Equal(t, "top secret", string(b))
	ents, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Len(t, ents, 1, "nothing planted outside")

	// Removing a link removes the link only.
	require.Zero(t, r.unlink(t, root, "absfile"))
	require.FileExists(t, secret)
	require.Zero(t, r.unlink(t, root, "abs"), "a link to a directory is unlinked, not removed as one")
	require.DirExists(t, outside)
}

// A directory the guest holds, swapped on the host for a symlink to the
// outside: the held node stays the original directory; a fresh LOOKUP sees
// the symlink and cannot pass it. The same for a file swapped after its
// LOOKUP: OPEN and WRITE reach the looked-up inode, not the link's target.
func TestDirectorySwappedForASymlinkBetweenLookups(t *testing.T) {
	r := newRig(t, Options{})
	outside := outsideDir(t, r)
	dir := r.export(t, "x", false, map[string]string{"d/inside": "inside"})
	r.initSession(t)
	root := r.walk(t, "x")
	d := r.walk(t, "x", "d")

	require.NoError(t, os.Rename(filepath.Join(dir, "d"), filepath.Join(dir, "d.orig")))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "d")))

	_, errno := r.lookup(t, d, "secret")
	require.Equal(t, syscall.ENOENT, errno, "the held directory is the original one")
	in, errno := r.lookup(t, d, "inside")
	require.Zero(t, errno)
	fh, errno := r.open(t, in.NodeId, syscall.O_RDONLY)
	require.Zero(t, errno)
	data, errno := r.read(t, in.NodeId, fh, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "inside", string(data))

	c, errno := r.create(t, d, "created", syscall.O_RDWR, 0o644)
	require.Zero(t, errno)
	r.release(t, c.NodeId, c.Fh, opRelease)
	_, errno = r.mkdir(t, d, "made", 0o755)
	require.Zero(t, errno)
	require.FileExists(t, filepath.Join(dir, "d.orig", "created"))
	require.DirExists(t, filepath.Join(dir, "d.orig", "made"))
	o, errno := r.opendir(t, d)
	require.Zero(t, errno)
	require.ElementsMatch(t, []string{".", "..", "inside", "created", "made"}, names(r.listDir(t, d, o.Fh, opReaddir, 4096)))

	// A fresh LOOKUP of d: the link, which leads nowhere.
	fresh, errno := r.lookup(t, root, "d")
	require.Zero(t, errno)
	require.NotEqual(t, d, fresh.NodeId)
	require.Equal(t, uint32(syscall.S_IFLNK), fresh.Attr.Mode&syscall.S_IFMT)
	_, errno = r.lookup(t, fresh.NodeId, "secret")
	require.Equal(t, syscall.ENOTDIR, errno)

	// The file swapped for a link after its LOOKUP.
	g, errno := r.lookup(t, d, "inside")
	require.Zero(t, errno)
	require.NoError(t, os.Rename(filepath.Join(dir, "d.orig", "inside"), filepath.Join(dir, "d.orig", "inside.orig")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "d.orig", "inside")))
	wfh, errno := r.open(t, g.NodeId, syscall.O_RDWR)
	require.Zero(t, errno)
	_, errno = r.write(t, g.NodeId, wfh, 0, []byte("INSIDE"))
	require.Zero(t, errno)
	_, errno = r.setattr(t, g.NodeId, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o666})
	require.Zero(t, errno)
	b, _ := os.ReadFile(filepath.Join(outside, "secret"))
	require.Equal(t, "top secret", string(b), "the outside file is untouched")
	require.Equal(t, uint32(0o600), lstat(t, filepath.Join(outside, "secret")).Mode&0o777)
	b, _ = os.ReadFile(filepath.Join(dir, "d.orig", "inside.orig"))
	require.Equal(t, "INSIDE", string(b), "the write went to the looked-up inode")
	ents, _ := os.ReadDir(outside)
	require.Len(t, ents, 1)
}

// Exports never share names: a hard link or a rename from one export into
// another is EXDEV, and so is a link of an export's root.
func TestHardLinkAcrossExportsRefused(t *testing.T) {
	r := newRig(t, Options{})
	aDir := r.export(t, "a", false, map[string]string{"f": "of a"})
	bDir := r.export(t, "b", false, map[string]string{"g": "of b"})
	r.initSession(t)
	a := r.walk(t, "a")
	b := r.walk(t, "b")
	f := r.walk(t, "a", "f")
	before := snapshot(t, r.dir)

	_, errno := r.link(t, f, b, "stolen")
	require.Equal(t, syscall.EXDEV, errno)
	require.Equal(t, syscall.EXDEV, r.rename(t, a, "f", b, "stolen"))
	_, errno = r.link(t, b, a, "broot")
	require.Equal(t, syscall.EXDEV, errno, "another export's root")
	_, errno = r.link(t, fuse.FUSE_ROOT_ID, a, "root")
	require.NotZero(t, errno, "the export list is no file")
	require.Equal(t, before, snapshot(t, r.dir))
	require.NoFileExists(t, filepath.Join(bDir, "stolen"))
	require.EqualValues(t, 1, lstat(t, filepath.Join(aDir, "f")).Nlink)

	// Within an export a hard link works.
	_, errno = r.link(t, f, a, "again")
	require.Zero(t, errno)
	require.EqualValues(t, 2, lstat(t, filepath.Join(aDir, "f")).Nlink)
}
