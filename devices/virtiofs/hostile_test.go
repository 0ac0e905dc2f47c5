package virtiofs

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

type mkdirIn struct{ Mode, Umask uint32 }

type createIn struct{ Flags, Mode, Umask, OpenFlags uint32 }

type renameIn struct{ Newdir uint64 }

type setattrIn struct {
	Valid, Padding                   uint32
	Fh, Size, LockOwner              uint64
	Atime, Mtime, Ctime              uint64
	Atimensec, Mtimensec, Ctimensec  uint32
	Mode, Unused4, Uid, Gid, Unused5 uint32
}

// A read-only export refuses every mutation with EROFS and the host
// directory is left as it was.
func TestReadOnlyExportRefusesEveryMutation(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "ro", true, map[string]string{"f": "keep", "d/x": "x"})
	r.initSession(t)
	root := r.walk(t, "ro")
	f := r.walk(t, "ro", "f")
	for name, rp := range map[string]reply{
		"mkdir":   r.call(t, opMkdir, root, &mkdirIn{Mode: 0o755}, cstr("new")),
		"create":  r.call(t, opCreate, root, &createIn{Flags: syscall.O_WRONLY, Mode: 0o644}, cstr("new")),
		"mknod":   r.call(t, opMknod, root, &struct{ Mode, Rdev, Umask, Padding uint32 }{Mode: syscall.S_IFIFO | 0o644}, cstr("new")),
		"symlink": r.call(t, opSymlink, root, nil, cstr("new"), cstr("f")),
		"link":    r.call(t, opLink, root, &struct{ Oldnodeid uint64 }{f}, cstr("new")),
		"unlink":  r.call(t, opUnlink, root, nil, cstr("f")),
		"rmdir":   r.call(t, opRmdir, root, nil, cstr("d")),
		"rename":  r.call(t, opRename, root, &renameIn{Newdir: root}, cstr("f"), cstr("g")),
		"setattr": r.call(t, opSetattr, f, &setattrIn{Valid: fuse.FATTR_SIZE}),
		"chmod":   r.call(t, opSetattr, f, &setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o777}),
	} {
		require.Equal(t, syscall.EROFS, rp.errno, name)
	}
	_, errno := r.open(t, f, syscall.O_RDWR)
	require.Equal(t, syscall.EROFS, errno, "open for writing")
	_, errno = r.open(t, f, syscall.O_RDONLY|syscall.O_TRUNC)
	require.Equal(t, syscall.EROFS, errno, "open with O_TRUNC")

	got, err := os.ReadFile(filepath.Join(dir, "f"))
	require.NoError(t, err)
	require.Equal(t, "keep", string(got))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2, "nothing created, nothing removed")
	st, err := os.Stat(filepath.Join(dir, "f"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), st.Mode().Perm())
}

// Names that would leave a directory are refused, and a symlink the host
// side plants pointing out of the export is reported, never followed.
func TestEscapesAreRefused(t *testing.T) {
	r := newRig(t, Options{})
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600))
	dir := r.export(t, "e1", false, map[string]string{"f": "x"})
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "out")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "outfile")))
	r.initSession(t)
	root := r.walk(t, "e1")
	for _, name := range []string{"..", ".", "/", "a/b", "", "x\x00y"} {
		_, errno := r.lookup(t, root, name)
		require.NotZero(t, errno, "lookup %q", name)
	}
	_, errno := r.lookup(t, fuse.FUSE_ROOT_ID, "..")
	require.NotZero(t, errno, "lookup .. of the root")

	link, errno := r.lookup(t, root, "out")
	require.Zero(t, errno)
	require.Equal(t, uint32(syscall.S_IFLNK), link.Attr.Mode&syscall.S_IFMT, "a symlink is reported as one")
	_, errno = r.lookup(t, link.NodeId, "secret")
	require.Equal(t, syscall.ENOTDIR, errno, "never walked through")
	rp := r.call(t, opReadlink, link.NodeId, nil)
	require.Zero(t, rp.errno)
	require.Equal(t, outside, string(rp.payload))

	file, errno := r.lookup(t, root, "outfile")
	require.Zero(t, errno)
	_, errno = r.open(t, file.NodeId, syscall.O_RDONLY)
	require.NotZero(t, errno, "a symlink is never opened on the host")
	rp = r.call(t, opSetattr, file.NodeId, &setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o777})
	require.NotZero(t, rp.errno, "chmod through a symlink")
	rp = r.call(t, opCreate, link.NodeId, &createIn{Flags: syscall.O_WRONLY, Mode: 0o644}, cstr("planted"))
	require.NotZero(t, rp.errno, "create beneath a symlink")
	_, err := os.Stat(filepath.Join(outside, "planted"))
	require.True(t, os.IsNotExist(err))
	st, err := os.Stat(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	// The export list itself is not listable.
	rp = r.call(t, opOpendir, fuse.FUSE_ROOT_ID, &openIn{})
	var o fuse.OpenOut
	rp.ok(t, &o)
	require.Empty(t, r.readdir(t, fuse.FUSE_ROOT_ID, o.Fh, opReaddir))
}

// A withdrawn export fails every held node and handle with ESTALE and its
// host descriptors are closed at once.
func TestWithdrawnExportIsStaleAndClosed(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"d/f": "data"})
	r.initSession(t)
	before := openFds(t)
	node := r.walk(t, "e1", "d", "f")
	fh, errno := r.open(t, node, syscall.O_RDWR)
	require.Zero(t, errno)
	require.Greater(t, openFds(t), before)

	r.exports.Remove("e1")
	require.Less(t, openFds(t), before, "every descriptor of the export closed, its root's too")
	_, errno = r.read(t, node, fh, 0, 10)
	require.Equal(t, syscall.ESTALE, errno)
	_, errno = r.write(t, node, fh, 0, []byte("x"))
	require.Equal(t, syscall.ESTALE, errno)
	require.Equal(t, syscall.ESTALE, r.call(t, opGetattr, node, &struct {
		Flags, Dummy uint32
		Fh           uint64
	}{}).errno)
	_, errno = r.lookup(t, fuse.FUSE_ROOT_ID, "e1")
	require.Equal(t, syscall.ENOENT, errno)
}

func openFds(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// Set-user-ID and set-group-ID bits never reach the host.
func TestSetIDBitsAreStripped(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "x"})
	r.initSession(t)
	root := r.walk(t, "e1")
	r.call(t, opCreate, root, &createIn{Flags: syscall.O_WRONLY, Mode: 0o6755}, cstr("c")).ok(t, nil)
	r.call(t, opMkdir, root, &mkdirIn{Mode: 0o6755}, cstr("m")).ok(t, nil)
	f := r.walk(t, "e1", "f")
	r.call(t, opSetattr, f, &setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o6755}).ok(t, nil)
	for _, name := range []string{"c", "m", "f"} {
		st, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Zero(t, st.Mode()&(os.ModeSetuid|os.ModeSetgid), name)
	}
}

// Stale and unknown ids, handles of the other kind and forgetting more
// than was looked up are refused or absorbed, never a crash.
func TestStaleIdsAndForgets(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"f": "x"})
	r.initSession(t)
	f := r.walk(t, "e1", "f")
	_, errno := r.read(t, f, 999, 0, 10)
	require.Equal(t, syscall.EBADF, errno, "unknown handle")
	fh, errno := r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	rp := r.call(t, opReaddir, f, &readIn{Fh: fh, Size: 4096})
	require.Equal(t, syscall.EBADF, rp.errno, "a file handle is not a directory handle")

	_, errno = r.lookup(t, 12345, "x")
	require.Equal(t, syscall.ESTALE, errno, "unknown node")
	r.forget(t, 12345, 1)
	r.forget(t, fuse.FUSE_ROOT_ID, 1<<60)
	r.forget(t, f, 1<<60) // more than looked up: forgotten
	_, errno = r.lookup(t, f, "x")
	require.Equal(t, syscall.ESTALE, errno, "a forgotten node")
	_, errno = r.read(t, f, fh, 0, 1)
	require.Zero(t, errno, "an open handle outlives its node's forget")
	_, errno = r.lookup(t, fuse.FUSE_ROOT_ID, "e1")
	require.Zero(t, errno, "the root still works")
}

// The node and handle tables are bounded.
func TestNodeAndHandleLimits(t *testing.T) {
	r := newRig(t, Options{MaxNodes: 10, MaxHandles: 3})
	files := map[string]string{}
	for i := range 20 {
		files["f"+strconv.Itoa(i)] = "x"
	}
	r.export(t, "e1", false, files)
	r.initSession(t)
	root := r.walk(t, "e1")
	var refused int
	for i := range 20 {
		if _, errno := r.lookup(t, root, "f"+strconv.Itoa(i)); errno == syscall.ENFILE {
			refused++
		}
	}
	nodes, _ := r.dev.Counts()
	require.Equal(t, 10, nodes)
	require.Equal(t, 12, refused, "root, e1 and 8 files fit")
	f := r.walk(t, "e1", "f0")
	for range 3 {
		_, errno := r.open(t, f, syscall.O_RDONLY)
		require.Zero(t, errno)
	}
	_, errno := r.open(t, f, syscall.O_RDONLY)
	require.Equal(t, syscall.ENFILE, errno)
}

// Malformed chains get an error reply or none, and the device serves on.
func TestMalformedRequests(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"f": "x"})
	r.initSession(t)

	// Shorter than a header: no unique to answer, an error header anyway.
	u := r.send(t, requestQueue, []byte{1, 2, 3}, 64)
	require.EqualValues(t, 16, u.Len)
	require.Equal(t, uint32(0xffffffff)-uint32(syscall.EIO)+1, binary.LittleEndian.Uint32(u.Data[4:]))

	// A header whose length lies, an unknown opcode, a missing name.
	msg, _ := r.encode(opLookup, fuse.FUSE_ROOT_ID, nil, cstr("e1"))
	binary.LittleEndian.PutUint32(msg, 1<<30)
	r.send(t, requestQueue, msg, 64)
	require.Equal(t, syscall.ENOSYS, r.call(t, 999, fuse.FUSE_ROOT_ID, nil).errno)
	r.send(t, requestQueue, func() []byte { m, _ := r.encode(opLookup, fuse.FUSE_ROOT_ID, nil); return m }(), 64)

	// Too large a request, and no room for any reply.
	big, _ := r.encode(opWrite, 2, &writeIn{Size: maxMessage}, make([]byte, maxMessage))
	u = r.send(t, requestQueue, big, 64)
	require.EqualValues(t, 16, u.Len)
	require.Equal(t, -int32(syscall.E2BIG), int32(binary.LittleEndian.Uint32(u.Data[4:])))
	msg, _ = r.encode(opGetattr, fuse.FUSE_ROOT_ID, &struct {
		Flags, Dummy uint32
		Fh           uint64
	}{})
	u = r.send(t, requestQueue, msg, 0)
	require.Zero(t, u.Len)

	// Still serving.
	_, errno := r.lookup(t, fuse.FUSE_ROOT_ID, "e1")
	require.Zero(t, errno)
}

// A reset in the middle of many concurrent requests returns once they
// are done and closes every descriptor of the session.
func TestResetDuringConcurrentRequestsClosesEverything(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"f": string(make([]byte, 1<<20))})
	r.initSession(t)
	before := openFds(t)
	f := r.walk(t, "e1", "f")
	fh, errno := r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	q := r.drv.Queue(requestQueue)
	for range 32 {
		msg, _ := r.encode(opRead, f, &readIn{Fh: fh, Size: 1 << 20})
		_, err := q.Add(virtiotestReadable(msg), virtiotestWritable(1<<20+64))
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); q.Kick() }()
	r.dev.Reset()
	wg.Wait()
	nodes, handles := r.dev.Counts()
	require.Zero(t, nodes+handles)
	require.LessOrEqual(t, openFds(t), before)
}
