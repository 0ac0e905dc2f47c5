package virtiofs

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The operation matrix: each FUSE operation the guest kernel sends,
// through the test driver, with its effect checked on the host and its
// errors checked by errno.

func lstat(t testing.TB, path string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Lstat(path, &st))
	return &st
}

func TestMatrixLookupAndGetattrMatchTheHost(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"d/f": "twelve bytes", "g": ""})
	require.NoError(t, os.Symlink("d/f", filepath.Join(dir, "l")))
	require.NoError(t, os.Link(filepath.Join(dir, "d/f"), filepath.Join(dir, "hard")))
	r.initSession(t)
	e1 := r.walk(t, "e1")

	d, errno := r.lookup(t, e1, "d")
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFDIR), d.Attr.Mode&syscall.S_IFMT)
	f, errno := r.lookup(t, d.NodeId, "f")
	require.Zero(t, errno)
	host := lstat(t, filepath.Join(dir, "d/f"))
	require.Equal(t, host.Mode, f.Attr.Mode)
	require.EqualValues(t, host.Size, f.Attr.Size)
	require.EqualValues(t, host.Nlink, f.Attr.Nlink)
	require.EqualValues(t, 2, f.Attr.Nlink)
	require.Equal(t, host.Uid, f.Attr.Uid)
	require.Equal(t, host.Gid, f.Attr.Gid)
	require.EqualValues(t, host.Mtim.Sec, f.Attr.Mtime)
	require.EqualValues(t, host.Mtim.Nsec, f.Attr.Mtimensec)

	a, errno := r.getattr(t, f.NodeId)
	require.Zero(t, errno)
	require.Equal(t, f.Attr, a.Attr, "GETATTR agrees with LOOKUP")

	hard, errno := r.lookup(t, e1, "hard")
	require.Zero(t, errno)
	require.Equal(t, f.NodeId, hard.NodeId, "one node per inode, whatever the name")
	require.Equal(t, f.Attr.Ino, hard.Attr.Ino)

	l, errno := r.lookup(t, e1, "l")
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFLNK), l.Attr.Mode&syscall.S_IFMT)
	require.EqualValues(t, len("d/f"), l.Attr.Size)

	// The inode number is the one READDIR reports, and stays across a
	// FORGET and a new LOOKUP (a new node id, never a reused one).
	o, errno := r.opendir(t, d.NodeId)
	require.Zero(t, errno)
	var listed uint64
	for _, ent := range r.listDir(t, d.NodeId, o.Fh, opReaddir, 4096) {
		if ent.name == "f" {
			listed = ent.ino
			require.Equal(t, uint32(syscall.S_IFREG), ent.typ)
		}
	}
	require.Equal(t, f.Attr.Ino, listed)
	r.forget(t, f.NodeId, 2) // LOOKUP of f and of hard
	again, errno := r.lookup(t, d.NodeId, "f")
	require.Zero(t, errno)
	require.Equal(t, f.Attr.Ino, again.Attr.Ino)
	require.Greater(t, again.NodeId, f.NodeId, "node ids are never reused")

	_, errno = r.lookup(t, e1, "missing")
	require.Equal(t, syscall.ENOENT, errno)
	_, errno = r.lookup(t, again.NodeId, "x")
	require.Equal(t, syscall.ENOTDIR, errno, "a file has no entries")
	_, errno = r.lookup(t, fuse.FUSE_ROOT_ID, "no-such-export")
	require.Equal(t, syscall.ENOENT, errno)

	root, errno := r.getattr(t, fuse.FUSE_ROOT_ID)
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFDIR|0o555), root.Attr.Mode, "the export list is a read-only directory")
}

func TestMatrixOpenReadWrite(t *testing.T) {
	r := newRig(t, Options{})
	big := bytes.Repeat([]byte("0123456789abcdef"), MaxWrite/16)
	dir := r.export(t, "e1", false, map[string]string{"f": "hello", "big": string(big), "d/x": ""})
	r.initSession(t)
	f := r.walk(t, "e1", "f")

	ro, errno := r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	data, errno := r.read(t, f, ro, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "hello", string(data))
	data, errno = r.read(t, f, ro, 5, 100)
	require.Zero(t, errno)
	require.Empty(t, data, "at the end of the file")
	data, errno = r.read(t, f, ro, 1<<40, 100)
	require.Zero(t, errno)
	require.Empty(t, data, "far past the end")
	data, errno = r.read(t, f, ro, 1, 0)
	require.Zero(t, errno)
	require.Empty(t, data)
	_, errno = r.read(t, f, ro, 1<<63, 10)
	require.Equal(t, syscall.EINVAL, errno, "an offset beyond int64")
	_, errno = r.write(t, f, ro, 0, []byte("x"))
	require.Equal(t, syscall.EBADF, errno, "a read-only handle does not write")

	rw, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	n, errno := r.write(t, f, rw, 3, []byte("p, world"))
	require.Zero(t, errno)
	require.EqualValues(t, 8, n)
	_, errno = r.write(t, f, rw, 1<<63, []byte("x"))
	require.Equal(t, syscall.EINVAL, errno)
	_, errno = r.write(t, f, rw, 1<<63-1, []byte("xx"))
	require.NotZero(t, errno, "a write past the largest offset")
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	require.NoError(t, err)
	require.Equal(t, "help, world", string(got))

	app, errno := r.open(t, f, syscall.O_WRONLY|syscall.O_APPEND)
	require.Zero(t, errno)
	_, errno = r.write(t, f, app, 0, []byte("!"))
	require.Zero(t, errno)
	got, _ = os.ReadFile(filepath.Join(dir, "f"))
	require.Equal(t, "help, world!", string(got), "O_APPEND appends")

	// The largest READ and WRITE the device negotiates.
	b := r.walk(t, "e1", "big")
	bh, errno := r.open(t, b, syscall.O_RDWR)
	require.Zero(t, errno)
	data, errno = r.read(t, b, bh, 0, MaxWrite)
	require.Zero(t, errno)
	require.True(t, bytes.Equal(big, data), "a MaxWrite read")
	rev := bytes.ToUpper(big)
	n, errno = r.write(t, b, bh, 0, rev)
	require.Zero(t, errno)
	require.EqualValues(t, MaxWrite, n)
	got, _ = os.ReadFile(filepath.Join(dir, "big"))
	require.True(t, bytes.Equal(rev, got), "a MaxWrite write")
	_, errno = r.read(t, b, bh, 0, 2*MaxWrite)
	require.NotZero(t, errno, "a READ larger than the reply the device offers")

	d := r.walk(t, "e1", "d")
	_, errno = r.open(t, d, syscall.O_RDONLY)
	require.Equal(t, syscall.EISDIR, errno, "OPEN of a directory")
	_, errno = r.opendir(t, f)
	require.Equal(t, syscall.ENOTDIR, errno, "OPENDIR of a file")
	_, errno = r.open(t, fuse.FUSE_ROOT_ID, syscall.O_RDONLY)
	require.Equal(t, syscall.EISDIR, errno)

	_, handles := r.dev.Counts()
	require.Equal(t, 4, handles)
	for _, h := range []uint64{ro, rw, app} {
		r.release(t, f, h, opRelease)
	}
	r.release(t, b, bh, opRelease)
	_, handles = r.dev.Counts()
	require.Zero(t, handles)
	_, errno = r.read(t, f, ro, 0, 1)
	require.Equal(t, syscall.EBADF, errno, "a released handle")
}

func TestMatrixCreate(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"exists": "keep", "f": ""})
	r.initSession(t)
	e1 := r.walk(t, "e1")

	c, errno := r.create(t, e1, "new", syscall.O_RDWR, syscall.S_IFREG|0o640)
	require.Zero(t, errno)
	require.NotZero(t, c.NodeId)
	require.Equal(t, uint32(syscall.S_IFREG|0o640), c.Attr.Mode)
	st := lstat(t, filepath.Join(dir, "new"))
	require.Equal(t, uint32(syscall.S_IFREG|0o640), st.Mode)
	_, errno = r.write(t, c.NodeId, c.Fh, 0, []byte("written through the created handle"))
	require.Zero(t, errno)
	data, errno := r.read(t, c.NodeId, c.Fh, 0, 100)
	require.Zero(t, errno, "CREATE with O_RDWR reads too")
	require.Equal(t, "written through the created handle", string(data))
	got, _ := os.ReadFile(filepath.Join(dir, "new"))
	require.Equal(t, "written through the created handle", string(got))
	e, errno := r.lookup(t, e1, "new")
	require.Zero(t, errno)
	require.Equal(t, c.NodeId, e.NodeId, "the created node is the looked-up one")
	require.Equal(t, c.Attr.Ino, e.Attr.Ino)
	require.Equal(t, lstat(t, filepath.Join(dir, "new")).Size, int64(e.Attr.Size))
	nodes, handles := r.dev.Counts()
	require.Equal(t, 3, nodes, "root, e1, new")
	require.Equal(t, 1, handles)

	_, errno = r.create(t, e1, "exists", syscall.O_RDWR|syscall.O_TRUNC, 0o644)
	require.Equal(t, syscall.EEXIST, errno, "CREATE never opens an existing name")
	got, _ = os.ReadFile(filepath.Join(dir, "exists"))
	require.Equal(t, "keep", string(got))

	f := r.walk(t, "e1", "f")
	_, errno = r.create(t, f, "x", syscall.O_RDWR, 0o644)
	require.Equal(t, syscall.ENOTDIR, errno, "CREATE under a file")
	_, errno = r.create(t, 999, "x", syscall.O_RDWR, 0o644)
	require.Equal(t, syscall.ESTALE, errno)
	_, errno = r.create(t, fuse.FUSE_ROOT_ID, "x", syscall.O_RDWR, 0o644)
	require.Equal(t, syscall.EROFS, errno, "the export list takes no files")
	_, handles = r.dev.Counts()
	require.Equal(t, 1, handles, "failed CREATEs hold nothing")
}

func TestMatrixMkdirMknodSymlinkLink(t *testing.T) {
	defer syscall.Umask(syscall.Umask(0o022))
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "data", "d/g": ""})
	r.initSession(t)
	e1 := r.walk(t, "e1")

	m, errno := r.mkdir(t, e1, "sub", 0o750)
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFDIR|0o750), m.Attr.Mode)
	require.Equal(t, uint32(syscall.S_IFDIR|0o750), lstat(t, filepath.Join(dir, "sub")).Mode)
	_, errno = r.mkdir(t, e1, "sub", 0o750)
	require.Equal(t, syscall.EEXIST, errno)
	_, errno = r.mkdir(t, m.NodeId, "nested", 0o700)
	require.Zero(t, errno)
	require.DirExists(t, filepath.Join(dir, "sub", "nested"))

	fifo, errno := r.mknod(t, e1, "fifo", syscall.S_IFIFO|0o644, 0)
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFIFO|0o644), fifo.Attr.Mode)
	require.Equal(t, uint32(syscall.S_IFIFO|0o644), lstat(t, filepath.Join(dir, "fifo")).Mode)
	_, errno = r.open(t, fifo.NodeId, syscall.O_RDONLY)
	require.NotZero(t, errno, "a FIFO is never opened on the host")
	reg, errno := r.mknod(t, e1, "regular", syscall.S_IFREG|0o600, 0)
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFREG|0o600), reg.Attr.Mode)
	for _, mode := range []uint32{syscall.S_IFCHR | 0o666, syscall.S_IFBLK | 0o666} {
		_, errno = r.mknod(t, e1, "dev", mode, uint32(unix.Mkdev(1, 3)))
		require.Equal(t, syscall.EPERM, errno, "no device node on the host (mode %o)", mode)
	}
	require.NoFileExists(t, filepath.Join(dir, "dev"))

	s, errno := r.symlink(t, e1, "link", "../../../etc/passwd")
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFLNK), s.Attr.Mode&syscall.S_IFMT)
	target, err := os.Readlink(filepath.Join(dir, "link"))
	require.NoError(t, err)
	require.Equal(t, "../../../etc/passwd", target, "stored as given, resolved only by the guest")
	got, errno := r.readlink(t, s.NodeId)
	require.Zero(t, errno)
	require.Equal(t, "../../../etc/passwd", got)
	_, errno = r.readlink(t, reg.NodeId)
	require.Equal(t, syscall.EINVAL, errno, "READLINK of a regular file")
	_, errno = r.symlink(t, e1, "empty", "")
	require.Equal(t, syscall.EINVAL, errno, "an empty target")
	_, errno = r.symlink(t, e1, "link", "x")
	require.Equal(t, syscall.EEXIST, errno)

	f := r.walk(t, "e1", "f")
	l, errno := r.link(t, f, m.NodeId, "hard")
	require.Zero(t, errno)
	require.Equal(t, f, l.NodeId, "a hard link is the same node")
	require.EqualValues(t, 2, l.Attr.Nlink)
	require.Equal(t, lstat(t, filepath.Join(dir, "f")).Ino, lstat(t, filepath.Join(dir, "sub", "hard")).Ino)
	_, errno = r.link(t, m.NodeId, e1, "dirlink")
	require.Equal(t, syscall.EPERM, errno, "no hard link to a directory")
	_, errno = r.link(t, s.NodeId, e1, "linklink")
	require.Equal(t, syscall.EPERM, errno, "no hard link to a symlink node")
	_, errno = r.link(t, f, e1, "regular")
	require.Equal(t, syscall.EEXIST, errno)
	_, errno = r.link(t, 999, e1, "x")
	require.Equal(t, syscall.ESTALE, errno)
	_, errno = r.link(t, f, f, "x")
	require.Equal(t, syscall.ENOTDIR, errno)

	for name, errno := range map[string]syscall.Errno{
		"mkdir":   func() syscall.Errno { _, e := r.mkdir(t, f, "x", 0o755); return e }(),
		"mknod":   func() syscall.Errno { _, e := r.mknod(t, f, "x", syscall.S_IFIFO|0o644, 0); return e }(),
		"symlink": func() syscall.Errno { _, e := r.symlink(t, f, "x", "y"); return e }(),
	} {
		require.Equal(t, syscall.ENOTDIR, errno, "%s under a file", name)
	}
}

func TestMatrixRename(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"a": "A", "b": "B", "d/x": "X"})
	other := r.export(t, "e2", false, nil)
	require.NoError(t, os.Symlink("a", filepath.Join(dir, "lnk")))
	r.initSession(t)
	e1 := r.walk(t, "e1")
	d := r.walk(t, "e1", "d")
	a := r.walk(t, "e1", "a")

	require.Zero(t, r.rename(t, e1, "a", d, "a2"))
	require.NoFileExists(t, filepath.Join(dir, "a"))
	got, err := os.ReadFile(filepath.Join(dir, "d", "a2"))
	require.NoError(t, err)
	require.Equal(t, "A", string(got))
	// The node the guest holds is the moved file.
	fh, errno := r.open(t, a, syscall.O_RDONLY)
	require.Zero(t, errno)
	data, errno := r.read(t, a, fh, 0, 10)
	require.Zero(t, errno)
	require.Equal(t, "A", string(data))
	e, errno := r.lookup(t, d, "a2")
	require.Zero(t, errno)
	require.Equal(t, a, e.NodeId)

	// Over an existing name: replaced.
	require.Zero(t, r.rename(t, e1, "b", d, "x"))
	got, _ = os.ReadFile(filepath.Join(dir, "d", "x"))
	require.Equal(t, "B", string(got))

	// A held symlink node learns its new place: its times are set on
	// the link there (by name, never through the link).
	l := r.walk(t, "e1", "lnk")
	require.Zero(t, r.rename(t, e1, "lnk", d, "lnk2"))
	when := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	_, errno = r.setattr(t, l, setattrIn{Valid: fuse.FATTR_MTIME, Mtime: uint64(when.Unix())})
	require.Zero(t, errno)
	require.EqualValues(t, when.Unix(), lstat(t, filepath.Join(dir, "d", "lnk2")).Mtim.Sec, "the moved link's own time")
	aTime := lstat(t, filepath.Join(dir, "d", "a2")).Mtim.Sec
	require.NotEqual(t, when.Unix(), aTime, "the link's target untouched")

	require.Equal(t, syscall.ENOENT, r.rename(t, e1, "missing", e1, "y"))
	require.Equal(t, syscall.EINVAL, r.rename(t, e1, "d", d, "inside"), "a directory into itself")
	require.Equal(t, syscall.ENOTDIR, r.rename(t, a, "x", e1, "y"), "a file is no directory")
	require.Equal(t, syscall.ESTALE, r.rename(t, e1, "d", 999, "y"))
	e2 := r.walk(t, "e2")
	require.Equal(t, syscall.EXDEV, r.rename(t, d, "x", e2, "x"), "across exports")
	require.NoFileExists(t, filepath.Join(other, "x"))
	require.Equal(t, syscall.EROFS, r.rename(t, fuse.FUSE_ROOT_ID, "e1", fuse.FUSE_ROOT_ID, "e3"), "an export's name")

	// RENAME2: flags are refused with ENOSYS (the guest kernel then
	// answers for itself); no flags is a plain rename.
	before := snapshot(t, dir)
	for _, flags := range []uint32{unix.RENAME_NOREPLACE, unix.RENAME_EXCHANGE, unix.RENAME_WHITEOUT} {
		rp := r.call(t, opRename2, d, &rename2In{Newdir: d, Flags: flags}, cstr("x"), cstr("a2"))
		require.Equal(t, syscall.ENOSYS, rp.errno, "flags %#x", flags)
	}
	require.Equal(t, before, snapshot(t, dir), "a refused RENAME2 changes nothing")
	r.call(t, opRename2, d, &rename2In{Newdir: e1}, cstr("x"), cstr("back")).ok(t, nil)
	require.FileExists(t, filepath.Join(dir, "back"))
}

func TestMatrixUnlinkAndRmdir(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "data", "full/x": "", "g": ""})
	require.NoError(t, os.Mkdir(filepath.Join(dir, "empty"), 0o755))
	r.initSession(t)
	e1 := r.walk(t, "e1")
	f := r.walk(t, "e1", "f")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)

	require.Zero(t, r.unlink(t, e1, "f"))
	require.NoFileExists(t, filepath.Join(dir, "f"))
	a, errno := r.getattr(t, f)
	require.Zero(t, errno, "a held node outlives its name")
	require.Zero(t, a.Attr.Nlink)
	_, errno = r.write(t, f, fh, 4, []byte("+more"))
	require.Zero(t, errno, "an open file outlives its name")
	data, errno := r.read(t, f, fh, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "data+more", string(data))
	_, errno = r.lookup(t, e1, "f")
	require.Equal(t, syscall.ENOENT, errno)

	require.Equal(t, syscall.ENOENT, r.unlink(t, e1, "f"))
	require.Equal(t, syscall.EISDIR, r.unlink(t, e1, "empty"), "UNLINK of a directory")
	require.Equal(t, syscall.ENOTDIR, r.rmdir(t, e1, "g"), "RMDIR of a file")
	require.Equal(t, syscall.ENOTEMPTY, r.rmdir(t, e1, "full"))
	require.DirExists(t, filepath.Join(dir, "full"))
	require.Zero(t, r.rmdir(t, e1, "empty"))
	require.NoDirExists(t, filepath.Join(dir, "empty"))
	require.Equal(t, syscall.EROFS, r.unlink(t, fuse.FUSE_ROOT_ID, "e1"))
	require.Equal(t, syscall.EROFS, r.rmdir(t, fuse.FUSE_ROOT_ID, "e1"))
	require.Equal(t, syscall.ESTALE, r.unlink(t, 999, "g"))
}

func TestMatrixReaddirAndReaddirplus(t *testing.T) {
	r := newRig(t, Options{})
	files := map[string]string{"sub/inner": ""}
	for i := range 40 {
		files["file-"+itoa(i)] = string(make([]byte, i))
	}
	dir := r.export(t, "e1", false, files)
	require.NoError(t, os.Symlink("file-001", filepath.Join(dir, "lnk")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	r.initSession(t)
	e1 := r.walk(t, "e1")
	want := []string{".", "..", "fifo", "lnk", "sub"}
	for i := range 40 {
		want = append(want, "file-"+itoa(i))
	}
	sort.Strings(want)

	o, errno := r.opendir(t, e1)
	require.Zero(t, errno)
	// Small requests resume where the last one stopped: every entry once.
	for _, size := range []uint32{48, 100, 4096} {
		got := names(r.listDir(t, e1, o.Fh, opReaddir, size))
		sort.Strings(got)
		require.Equal(t, want, got, "READDIR in %d-byte replies", size)
	}
	require.Empty(t, r.call(t, opReaddir, e1, &readIn{Fh: o.Fh, Offset: 1 << 63, Size: 4096}).payload, "an offset past any host position")

	nodesBefore, _ := r.dev.Counts()
	ents := r.listDir(t, e1, o.Fh, opReaddirplus, 4096)
	got := names(ents)
	sort.Strings(got)
	require.Equal(t, want, got, "READDIRPLUS")
	for _, ent := range ents {
		if ent.name == "." || ent.name == ".." {
			require.Zero(t, ent.entry.NodeId, "%s is not looked up", ent.name)
			continue
		}
		host := lstat(t, filepath.Join(dir, ent.name))
		require.NotZero(t, ent.entry.NodeId, ent.name)
		require.Equal(t, host.Mode, ent.entry.Attr.Mode, ent.name)
		require.EqualValues(t, host.Size, ent.entry.Attr.Size, ent.name)
		require.Equal(t, host.Mode&syscall.S_IFMT, ent.typ, "%s: the entry's type is its attributes'", ent.name)
		require.Equal(t, ent.ino, ent.entry.Attr.Ino, ent.name)
		a, errno := r.getattr(t, ent.entry.NodeId)
		require.Zero(t, errno, "%s: the entry's node works", ent.name)
		require.Equal(t, ent.entry.Attr.Ino, a.Attr.Ino)
	}
	nodes, _ := r.dev.Counts()
	require.Equal(t, nodesBefore+len(want)-2, nodes, "one node per entry")
	// Each entry counts as one lookup: one FORGET ends it.
	sub := ents[0].entry.NodeId
	for _, ent := range ents {
		if ent.name == "sub" {
			sub = ent.entry.NodeId
		}
	}
	r.forget(t, sub, 1)
	_, errno = r.getattr(t, sub)
	require.Equal(t, syscall.ESTALE, errno)

	// Small READDIRPLUS requests list everything too.
	got = names(r.listDir(t, e1, o.Fh, opReaddirplus, 200))
	sort.Strings(got)
	require.Equal(t, want, got, "READDIRPLUS in 200-byte replies")

	r.release(t, e1, o.Fh, opReleasedir)
	_, handles := r.dev.Counts()
	require.Zero(t, handles)
	rp := r.call(t, opReaddir, e1, &readIn{Fh: o.Fh, Size: 4096})
	require.Equal(t, syscall.EBADF, rp.errno, "a released directory handle")
}

func TestMatrixSetattr(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "0123456789", "d/x": ""})
	r.initSession(t)
	f := r.walk(t, "e1", "f")
	path := filepath.Join(dir, "f")

	a, errno := r.setattr(t, f, setattrIn{Valid: fuse.FATTR_SIZE, Size: 3})
	require.Zero(t, errno)
	require.EqualValues(t, 3, a.Attr.Size)
	got, _ := os.ReadFile(path)
	require.Equal(t, "012", string(got), "truncated")
	_, errno = r.setattr(t, f, setattrIn{Valid: fuse.FATTR_SIZE, Size: 8})
	require.Zero(t, errno)
	got, _ = os.ReadFile(path)
	require.Equal(t, "012\x00\x00\x00\x00\x00", string(got), "extended")
	_, errno = r.setattr(t, f, setattrIn{Valid: fuse.FATTR_SIZE, Size: 1 << 63})
	require.Equal(t, syscall.EFBIG, errno)

	a, errno = r.setattr(t, f, setattrIn{Valid: fuse.FATTR_MODE, Mode: syscall.S_IFREG | 0o604})
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFREG|0o604), a.Attr.Mode)
	require.Equal(t, uint32(syscall.S_IFREG|0o604), lstat(t, path).Mode)

	atime := time.Date(1999, 12, 31, 23, 59, 58, 123456789, time.UTC)
	mtime := time.Date(2010, 6, 7, 8, 9, 10, 987654321, time.UTC)
	a, errno = r.setattr(t, f, setattrIn{
		Valid: fuse.FATTR_ATIME | fuse.FATTR_MTIME,
		Atime: uint64(atime.Unix()), Atimensec: uint32(atime.Nanosecond()),
		Mtime: uint64(mtime.Unix()), Mtimensec: uint32(mtime.Nanosecond()),
	})
	require.Zero(t, errno)
	st := lstat(t, path)
	require.Equal(t, atime.UnixNano(), time.Unix(st.Atim.Sec, st.Atim.Nsec).UnixNano())
	require.Equal(t, mtime.UnixNano(), time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UnixNano())
	require.EqualValues(t, mtime.Unix(), a.Attr.Mtime)
	require.EqualValues(t, mtime.Nanosecond(), a.Attr.Mtimensec)

	before := time.Now().Add(-time.Second)
	_, errno = r.setattr(t, f, setattrIn{Valid: fuse.FATTR_MTIME | fuse.FATTR_MTIME_NOW})
	require.Zero(t, errno)
	st = lstat(t, path)
	require.True(t, time.Unix(st.Mtim.Sec, st.Mtim.Nsec).After(before), "MTIME_NOW")
	require.Equal(t, atime.Unix(), st.Atim.Sec, "atime left alone")

	// Owner: our own ids are always allowed.
	_, errno = r.setattr(t, f, setattrIn{Valid: fuse.FATTR_UID | fuse.FATTR_GID, Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())})
	require.Zero(t, errno)

	d := r.walk(t, "e1", "d")
	_, errno = r.setattr(t, d, setattrIn{Valid: fuse.FATTR_SIZE, Size: 0})
	require.Equal(t, syscall.EISDIR, errno)
	a, errno = r.setattr(t, d, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o700})
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFDIR|0o700), lstat(t, filepath.Join(dir, "d")).Mode)
	_, errno = r.setattr(t, fuse.FUSE_ROOT_ID, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o777})
	require.Equal(t, syscall.EROFS, errno)
	_, errno = r.setattr(t, 999, setattrIn{Valid: fuse.FATTR_SIZE})
	require.Equal(t, syscall.ESTALE, errno)
}

func TestMatrixFsyncFlushRelease(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"f": "x", "d/g": ""})
	r.initSession(t)
	f := r.walk(t, "e1", "f")
	d := r.walk(t, "e1", "d")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	dh, errno := r.opendir(t, d)
	require.Zero(t, errno)
	rofh, errno := r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)

	require.Zero(t, r.fsync(t, f, fh, opFsync))
	require.Zero(t, r.fsync(t, f, rofh, opFsync))
	require.Zero(t, r.fsync(t, d, dh.Fh, opFsyncdir))
	require.Zero(t, r.flush(t, f, fh))
	require.Equal(t, syscall.EBADF, r.fsync(t, d, dh.Fh, opFsync), "FSYNC of a directory handle")
	require.Equal(t, syscall.EBADF, r.fsync(t, f, fh, opFsyncdir), "FSYNCDIR of a file handle")
	require.Equal(t, syscall.EBADF, r.flush(t, d, dh.Fh), "FLUSH of a directory handle")
	require.Equal(t, syscall.EBADF, r.fsync(t, f, 999, opFsync))
	require.Equal(t, syscall.EBADF, r.flush(t, f, 999))

	// RELEASE and RELEASEDIR of the other kind are ignored.
	r.release(t, d, fh, opReleasedir)
	r.release(t, f, dh.Fh, opRelease)
	_, handles := r.dev.Counts()
	require.Equal(t, 3, handles)
	_, errno = r.write(t, f, fh, 0, []byte("y"))
	require.Zero(t, errno, "the file handle survived a RELEASEDIR")
	require.NotEmpty(t, r.listDir(t, d, dh.Fh, opReaddir, 4096), "the directory handle survived a RELEASE")

	r.release(t, f, fh, opRelease)
	r.release(t, f, fh, opRelease) // twice: ignored
	r.release(t, d, dh.Fh, opReleasedir)
	r.release(t, f, rofh, opRelease)
	_, handles = r.dev.Counts()
	require.Zero(t, handles)
	require.Equal(t, syscall.EBADF, r.flush(t, f, fh))
}

// TestMatrixSyncfs: the guest's sync(2) of the mount (FUSE_SYNCFS) is
// served, not refused with ENOSYS (after which the guest never asks
// again): the host file systems of the writable exports are synced. With
// the writable export withdrawn there is nothing left to sync, and that
// succeeds too. A SYNCFS without its fuse_syncfs_in is refused.
func TestMatrixSyncfs(t *testing.T) {
	type syncfsIn struct{ Padding uint64 }
	r := newRig(t, Options{})
	r.export(t, "rw", false, map[string]string{"f": "x"})
	r.export(t, "ro", true, map[string]string{"g": "y"})
	r.initSession(t)
	f := r.walk(t, "rw", "f")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	_, errno = r.write(t, f, fh, 0, []byte("synced"))
	require.Zero(t, errno)
	require.Zero(t, r.call(t, opSyncfs, fuse.FUSE_ROOT_ID, syncfsIn{}).errno)
	r.exports.Remove("rw")
	require.Zero(t, r.call(t, opSyncfs, fuse.FUSE_ROOT_ID, syncfsIn{}).errno, "with the writable export withdrawn")
	require.NotZero(t, r.call(t, opSyncfs, fuse.FUSE_ROOT_ID, nil).errno, "a SYNCFS without its fuse_syncfs_in")
}

func TestMatrixStatfs(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "x"})
	r.initSession(t)
	f := r.walk(t, "e1", "f")
	s, errno := r.statfs(t, f)
	require.Zero(t, errno)
	var host unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &host))
	require.Equal(t, host.Blocks, s.Blocks)
	require.EqualValues(t, host.Bsize, s.Bsize)
	require.EqualValues(t, host.Namelen, s.NameLen)
	require.Equal(t, host.Files, s.Files)

	s, errno = r.statfs(t, fuse.FUSE_ROOT_ID)
	require.Zero(t, errno)
	require.EqualValues(t, 255, s.NameLen)
	require.EqualValues(t, 4096, s.Bsize)
	_, errno = r.statfs(t, 999)
	require.Equal(t, syscall.ESTALE, errno)
}
