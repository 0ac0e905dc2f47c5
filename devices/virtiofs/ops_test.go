package virtiofs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// The mutating operations a guest's shell runs, each checked on the host.
func TestOperationsReachTheHost(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "0123456789"})
	r.initSession(t)
	root := r.walk(t, "e1")

	var created fuse.CreateOut
	r.call(t, opCreate, root, &createIn{Flags: syscall.O_RDWR, Mode: 0o640}, cstr("new")).ok(t, &created)
	n, errno := r.write(t, created.NodeId, created.Fh, 0, []byte("made in the guest"))
	require.Zero(t, errno)
	require.EqualValues(t, 17, n)
	r.call(t, opFsync, created.NodeId, &struct {
		Fh         uint64
		Flags, Pad uint32
	}{Fh: created.Fh}).ok(t, nil)
	r.call(t, opFlush, created.NodeId, &struct {
		Fh          uint64
		Unused, Pad uint32
		Owner       uint64
	}{Fh: created.Fh}).ok(t, nil)
	r.release(t, created.NodeId, created.Fh, opRelease)
	got, err := os.ReadFile(filepath.Join(dir, "new"))
	require.NoError(t, err)
	require.Equal(t, "made in the guest", string(got))
	st, err := os.Stat(filepath.Join(dir, "new"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o640), st.Mode().Perm())

	var e fuse.EntryOut
	r.call(t, opMkdir, root, &mkdirIn{Mode: 0o750}, cstr("sub")).ok(t, &e)
	require.Equal(t, uint32(syscall.S_IFDIR), e.Attr.Mode&syscall.S_IFMT)
	r.call(t, opRename, root, &renameIn{Newdir: e.NodeId}, cstr("new"), cstr("moved")).ok(t, nil)
	require.FileExists(t, filepath.Join(dir, "sub", "moved"))
	require.Equal(t, syscall.ENOSYS, r.call(t, opRename2, root, &struct {
		Newdir     uint64
		Flags, Pad uint32
	}{e.NodeId, 1, 0}, cstr("f"), cstr("g")).errno, "RENAME2 flags")

	r.call(t, opSymlink, root, nil, cstr("link"), cstr("sub/moved")).ok(t, nil)
	target, err := os.Readlink(filepath.Join(dir, "link"))
	require.NoError(t, err)
	require.Equal(t, "sub/moved", target)
	f := r.walk(t, "e1", "f")
	sub := e.NodeId
	var linked fuse.EntryOut
	r.call(t, opLink, root, &struct{ Oldnodeid uint64 }{f}, cstr("hard")).ok(t, &linked)
	require.Equal(t, f, linked.NodeId, "a hard link is the same node")
	require.EqualValues(t, 2, linked.Attr.Nlink)

	var a fuse.AttrOut
	r.call(t, opSetattr, f, &setattrIn{Valid: fuse.FATTR_SIZE | fuse.FATTR_MODE | fuse.FATTR_MTIME, Size: 4, Mode: 0o600, Mtime: 1000}).ok(t, &a)
	require.EqualValues(t, 4, a.Attr.Size)
	st, err = os.Stat(filepath.Join(dir, "f"))
	require.NoError(t, err)
	require.EqualValues(t, 4, st.Size())
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	require.EqualValues(t, 1000, st.ModTime().Unix())

	r.call(t, opUnlink, root, nil, cstr("hard")).ok(t, nil)
	r.call(t, opUnlink, sub, nil, cstr("moved")).ok(t, nil)
	require.Equal(t, syscall.ENOTDIR, r.call(t, opUnlink, f, nil, cstr("x")).errno, "a file is no parent")
	r.call(t, opRmdir, root, nil, cstr("sub")).ok(t, nil)
	require.NoDirExists(t, filepath.Join(dir, "sub"))

	var s fuse.StatfsOut
	r.call(t, opStatfs, root, nil).ok(t, &s)
	require.NotZero(t, s.Blocks)
	require.NotZero(t, s.Bsize)
}

// A single-file export shows that one file and nothing of its directory.
func TestSingleFileExport(t *testing.T) {
	r := newRig(t, Options{})
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".gitconfig"), []byte("[user]"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".bashrc"), []byte("secret"), 0o644))
	require.NoError(t, r.exports.AddFile("e1", filepath.Join(dir, ".gitconfig"), false))
	r.initSession(t)
	view := r.walk(t, "e1")
	_, errno := r.lookup(t, view, ".bashrc")
	require.Equal(t, syscall.ENOENT, errno)
	f := r.walk(t, "e1", ".gitconfig")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	_, errno = r.write(t, f, fh, 6, []byte(" name"))
	require.Zero(t, errno)
	got, err := os.ReadFile(filepath.Join(dir, ".gitconfig"))
	require.NoError(t, err)
	require.Equal(t, "[user] name", string(got))
	require.NotZero(t, r.call(t, opCreate, view, &createIn{Flags: syscall.O_WRONLY, Mode: 0o644}, cstr("planted")).errno)
	require.NoFileExists(t, filepath.Join(dir, "planted"))
}
