package hostfs

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// harness runs a real p9 client against a real p9 server over a pipe.
type harness struct {
	base    string // parent of every test directory
	exports *Exports
	client  *p9.Client
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{base: t.TempDir(), exports: NewExports(discard())}
	srv := p9.NewServer(h.exports)
	c1, c2 := net.Pipe()
	go func() { _ = srv.Handle(parkingReader{c2}, c2) }()
	client, err := p9.NewClient(c1)
	require.NoError(t, err)
	h.client = client
	t.Cleanup(func() {
		_ = client.Close()
		_ = c1.Close()
		h.exports.Close()
	})
	return h
}

// parkingReader never reports the end of the stream to the p9 server:
// hugelgupf/p9 v0.3.0 races when a connection ends (connState.stop waits on
// a WaitGroup that a just-spawned receive goroutine may still Add to, which
// panics or trips the race detector). The test's server goroutines are
// left parked instead; every fid was clunked by the test's cleanups.
type parkingReader struct{ net.Conn }

func (p parkingReader) Read(b []byte) (int, error) {
	n, err := p.Conn.Read(b)
	if err != nil && n == 0 {
		select {} // park forever
	}
	return n, err
}

// export makes a host directory with the given files and registers it.
func (h *harness) export(t *testing.T, name string, readOnly bool, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(h.base, name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for p, content := range files {
		full := filepath.Join(dir, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(content), 0o644))
	}
	require.NoError(t, h.exports.Add(name, dir, readOnly))
	return dir
}

func (h *harness) attach(t *testing.T, name string) p9.File {
	t.Helper()
	root, err := h.client.Attach(name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = root.Close() })
	return root
}

func walk(t *testing.T, from p9.File, names ...string) p9.File {
	t.Helper()
	_, f, err := from.Walk(names)
	require.NoError(t, err, "walk %v", names)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func readAll(t *testing.T, f p9.File) string {
	t.Helper()
	buf := make([]byte, 1<<16)
	n, err := f.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		require.NoError(t, err)
	}
	return string(buf[:n])
}

func readdirNames(t *testing.T, dir p9.File) []string {
	t.Helper()
	d := walk(t, dir)
	_, _, err := d.Open(p9.ReadOnly)
	require.NoError(t, err)
	var names []string
	offset := uint64(0)
	for {
		ents, err := d.Readdir(offset, 4096)
		require.NoError(t, err)
		if len(ents) == 0 {
			break
		}
		for _, e := range ents {
			if e.Name != "." && e.Name != ".." {
				names = append(names, e.Name)
			}
			offset = e.Offset
		}
	}
	sort.Strings(names)
	return names
}

func TestReadWriteExport(t *testing.T) {
	h := newHarness(t)
	dir := h.export(t, "rw", false, map[string]string{"hello.txt": "hello world", "sub/inner.txt": "inner"})
	root := h.attach(t, "rw")

	// read an existing file
	f := walk(t, root, "hello.txt")
	_, _, err := f.Open(p9.ReadOnly)
	require.NoError(t, err)
	assert.Equal(t, "hello world", readAll(t, f))

	// getattr
	_, valid, attr, err := f.GetAttr(p9.AttrMaskAll)
	require.NoError(t, err)
	assert.True(t, valid.Size)
	assert.Equal(t, uint64(11), attr.Size)
	assert.True(t, attr.Mode.IsRegular())

	// create + write + fsync
	d := walk(t, root)
	nf, _, _, err := d.Create("new.txt", p9.ReadWrite, 0o640, p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	n, err := nf.WriteAt([]byte("written from the guest"), 0)
	require.NoError(t, err)
	assert.Equal(t, 22, n)
	require.NoError(t, nf.FSync())
	require.NoError(t, nf.Close())
	b, err := os.ReadFile(filepath.Join(dir, "new.txt"))
	require.NoError(t, err)
	assert.Equal(t, "written from the guest", string(b))
	st, err := os.Stat(filepath.Join(dir, "new.txt"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), st.Mode().Perm())

	// open existing for write with truncate
	wf := walk(t, root, "hello.txt")
	_, _, err = wf.Open(p9.WriteOnly | p9.OpenFlags(unix.O_TRUNC))
	require.NoError(t, err)
	_, err = wf.WriteAt([]byte("bye"), 0)
	require.NoError(t, err)
	b, _ = os.ReadFile(filepath.Join(dir, "hello.txt"))
	assert.Equal(t, "bye", string(b))

	// mkdir
	_, err = root.Mkdir("made", 0o750, p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	st, err = os.Stat(filepath.Join(dir, "made"))
	require.NoError(t, err)
	assert.True(t, st.IsDir())

	// renameat into the new dir, and rename (Trename) back out
	made := walk(t, root, "made")
	require.NoError(t, root.RenameAt("new.txt", made, "moved.txt"))
	b, err = os.ReadFile(filepath.Join(dir, "made", "moved.txt"))
	require.NoError(t, err)
	assert.Equal(t, "written from the guest", string(b))
	moved := walk(t, made, "moved.txt")
	require.NoError(t, moved.Rename(root, "back.txt"))
	_, err = os.Stat(filepath.Join(dir, "back.txt"))
	require.NoError(t, err)

	// readdir
	assert.Equal(t, []string{"back.txt", "hello.txt", "made", "sub"}, readdirNames(t, root))

	// setattr: size, permissions, times
	back := walk(t, root, "back.txt")
	require.NoError(t, back.SetAttr(p9.SetAttrMask{Size: true, Permissions: true, MTime: true, MTimeNotSystemTime: true},
		p9.SetAttr{Size: 4, Permissions: 0o600, MTimeSeconds: 1_000_000_000}))
	st, err = os.Stat(filepath.Join(dir, "back.txt"))
	require.NoError(t, err)
	assert.Equal(t, int64(4), st.Size())
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.Equal(t, int64(1_000_000_000), st.ModTime().Unix())

	// symlink + readlink (the target is stored, never followed on the host)
	_, err = root.Symlink("/etc/passwd", "abs-link", p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	link := walk(t, root, "abs-link")
	target, err := link.Readlink()
	require.NoError(t, err)
	assert.Equal(t, "/etc/passwd", target)

	// hard link
	require.NoError(t, root.Link(back, "hard.txt"))
	st1, _ := os.Stat(filepath.Join(dir, "hard.txt"))
	st2, _ := os.Stat(filepath.Join(dir, "back.txt"))
	assert.True(t, os.SameFile(st1, st2))

	// unlink a file and a directory
	require.NoError(t, root.UnlinkAt("hard.txt", 0))
	_, err = os.Stat(filepath.Join(dir, "hard.txt"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.ErrorIs(t, made.UnlinkAt("moved.txt", 0), linux.ENOENT, "already moved out")
	require.NoError(t, root.UnlinkAt("made", unix.AT_REMOVEDIR))
	_, err = os.Stat(filepath.Join(dir, "made"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	err = root.UnlinkAt("sub", unix.AT_REMOVEDIR)
	assert.ErrorIs(t, err, linux.ENOTEMPTY, "exact errno, not folded into EEXIST")

	// statfs and lock
	fsStat, err := root.StatFS()
	require.NoError(t, err)
	assert.NotZero(t, fsStat.BlockSize)
	// (p9's client sends Tlock without its fid, so Lock is checked on the
	// file system directly.)
	direct := directWalk(t, h.exports, "rw", "back.txt")
	status, err := direct.Lock(1, p9.WriteLock, 0, 0, 0, "guest")
	require.NoError(t, err)
	assert.Equal(t, p9.LockStatusOK, status)
}

// directWalk walks the file system without the p9 server (so without its
// name checks): the confinement must hold on its own.
func directWalk(t *testing.T, x *Exports, names ...string) p9.File {
	t.Helper()
	cur, err := x.Attach()
	require.NoError(t, err)
	for _, n := range names {
		_, next, err := cur.Walk([]string{n})
		require.NoError(t, err, "walk %q", n)
		_ = cur.Close()
		cur = next
	}
	t.Cleanup(func() { _ = cur.Close() })
	return cur
}

func TestSpecialFilesAndXattrs(t *testing.T) {
	h := newHarness(t)
	dir := h.export(t, "rw", false, map[string]string{"f": "x"})
	root := directWalk(t, h.exports, "rw")

	_, err := root.Mknod("fifo", p9.FileMode(unix.S_IFIFO|0o644), 0, 0, p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	st, err := os.Lstat(filepath.Join(dir, "fifo"))
	require.NoError(t, err)
	assert.Equal(t, os.ModeNamedPipe, st.Mode().Type())
	_, err = root.Mknod("dev", p9.FileMode(unix.S_IFCHR|0o644), 1, 3, p9.NoUID, p9.NoGID)
	assert.ErrorIs(t, err, linux.EPERM, "no device nodes")

	// A FIFO is never opened on the host (it would block the server).
	_, fifo, err := root.Walk([]string{"fifo"})
	require.NoError(t, err)
	defer fifo.Close()
	_, _, err = fifo.Open(p9.ReadOnly)
	assert.ErrorIs(t, err, linux.EPERM)

	qids, f, valid, attr, err := root.WalkGetAttr([]string{"f"})
	require.NoError(t, err)
	defer f.Close()
	require.Len(t, qids, 1)
	assert.True(t, valid.Size)
	assert.Equal(t, uint64(1), attr.Size)

	_, err = f.GetXattr("user.x")
	assert.ErrorIs(t, err, linux.ENODATA)
	names, err := f.ListXattrs()
	require.NoError(t, err)
	assert.Empty(t, names)
	assert.ErrorIs(t, f.SetXattr("user.x", []byte("v"), 0), linux.EOPNOTSUPP)
	assert.ErrorIs(t, f.RemoveXattr("user.x"), linux.EOPNOTSUPP)

	_, err = f.ReadAt(make([]byte, 1), 0)
	assert.ErrorIs(t, err, linux.EBADF, "read before open")
	assert.NoError(t, f.FSync(), "fsync of an unopened fid is a no-op")

	// Cross-export link refused.
	h.export(t, "other", false, nil)
	other := directWalk(t, h.exports, "other")
	assert.ErrorIs(t, other.Link(f, "l"), linux.EXDEV)
}
