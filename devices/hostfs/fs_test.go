package hostfs

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs/hostfstest"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// harness serves exports in a temporary directory; tests drive the
// layer's Nodes directly, as a file server does.
type harness struct {
	base    string // parent of every test directory
	exports *Exports
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{base: t.TempDir(), exports: NewExports(discard())}
	t.Cleanup(h.exports.Close)
	return h
}

// export makes a host directory with the given files and registers it.
func (h *harness) export(t *testing.T, name string, readOnly bool, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(h.base, name)
	hostfstest.WriteTree(t, dir, files)
	require.NoError(t, h.exports.Add(name, dir, readOnly))
	return dir
}

// attach returns the root of export name (the attach root for ""),
// closed at the end of the test.
func (h *harness) attach(t *testing.T, name string) Node {
	t.Helper()
	if name == "" {
		return h.exports.Root()
	}
	root, _, err := h.exports.Root().Walk(name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = root.Close() })
	return root
}

// walk returns from's node at names, one Walk at a time (a clone when no
// names), closed at the end of the test.
func walk(t *testing.T, from Node, names ...string) Node {
	t.Helper()
	cur, err := from.Clone()
	require.NoError(t, err)
	for _, name := range names {
		next, _, err := cur.Walk(name)
		_ = cur.Close()
		require.NoError(t, err, "walk %v", names)
		cur = next
	}
	t.Cleanup(func() { _ = cur.Close() })
	return cur
}

// walkPath walks from from to names, closing what it walked to, and
// returns the first error.
func walkPath(from Node, names ...string) error {
	cur, err := from.Clone()
	for _, name := range names {
		if err != nil {
			break
		}
		var next Node
		next, _, err = cur.Walk(name)
		_ = cur.Close()
		cur = next
	}
	if err == nil {
		_ = cur.Close()
	}
	return err
}

// readAt and writeAt are ReadvAt and WritevAt of one buffer.
func readAt(n Node, p []byte, offset int64) (int, error) { return n.ReadvAt([][]byte{p}, offset) }

func writeAt(n Node, p []byte, offset int64) (int, error) { return n.WritevAt([][]byte{p}, offset) }

func readAll(t *testing.T, f Node) string {
	t.Helper()
	buf := make([]byte, 1<<16)
	n, err := readAt(f, buf, 0)
	require.NoError(t, err)
	return string(buf[:n])
}

func readdirNames(t *testing.T, dir Node) []string {
	t.Helper()
	d := walk(t, dir)
	_, err := d.Open(unix.O_RDONLY)
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
	_, err := f.Open(unix.O_RDONLY)
	require.NoError(t, err)
	assert.Equal(t, "hello world", readAll(t, f))

	// getattr
	attr, err := f.Stat()
	require.NoError(t, err)
	assert.Equal(t, int64(11), attr.Stat.Size)
	assert.Equal(t, uint32(unix.S_IFREG), attr.Stat.Mode&unix.S_IFMT)

	// create + write + fsync
	d := walk(t, root)
	nf, _, err := d.Create("new.txt", unix.O_RDWR, 0o640)
	require.NoError(t, err)
	n, err := writeAt(nf, []byte("written from the guest"), 0)
	require.NoError(t, err)
	assert.Equal(t, 22, n)
	require.NoError(t, nf.Sync())
	require.NoError(t, nf.Close())
	b, err := os.ReadFile(filepath.Join(dir, "new.txt"))
	require.NoError(t, err)
	assert.Equal(t, "written from the guest", string(b))
	st, err := os.Stat(filepath.Join(dir, "new.txt"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), st.Mode().Perm())

	// open existing for write with truncate
	wf := walk(t, root, "hello.txt")
	_, err = wf.Open(unix.O_WRONLY | unix.O_TRUNC)
	require.NoError(t, err)
	_, err = writeAt(wf, []byte("bye"), 0)
	require.NoError(t, err)
	b, _ = os.ReadFile(filepath.Join(dir, "hello.txt"))
	assert.Equal(t, "bye", string(b))

	// mkdir
	_, err = root.Mkdir("made", 0o750)
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
	attrsLinksAndRemoval(t, h, root, made, dir)
}

// attrsLinksAndRemoval goes on with TestReadWriteExport's export: root
// holds back.txt and the directories made (now empty) and sub.
func attrsLinksAndRemoval(t *testing.T, h *harness, root, made Node, dir string) {
	t.Helper()
	// setattr: size, permissions, times
	back := walk(t, root, "back.txt")
	require.NoError(t, back.SetAttr(SetAttr{Valid: SetSize | SetMode | SetMTime,
		Size: 4, Mode: 0o600, MTime: SetTime(false, 1_000_000_000, 0)}))
	st, err := os.Stat(filepath.Join(dir, "back.txt"))
	require.NoError(t, err)
	assert.Equal(t, int64(4), st.Size())
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.Equal(t, int64(1_000_000_000), st.ModTime().Unix())

	// symlink + readlink (the target is stored, never followed on the host)
	_, err = root.Symlink("/etc/passwd", "abs-link")
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
	assert.ErrorIs(t, made.UnlinkAt("moved.txt", 0), unix.ENOENT, "already moved out")
	require.NoError(t, root.UnlinkAt("made", unix.AT_REMOVEDIR))
	_, err = os.Stat(filepath.Join(dir, "made"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	err = root.UnlinkAt("sub", unix.AT_REMOVEDIR)
	assert.ErrorIs(t, err, unix.ENOTEMPTY, "exact errno, not folded into EEXIST")

	// statfs and lock
	fsStat, err := root.StatFS()
	require.NoError(t, err)
	assert.NotZero(t, fsStat.Bsize)
	direct := directWalk(t, h.exports, "rw", "back.txt")
	require.NoError(t, direct.Check())
}

// directWalk walks from the attach root of x to names.
func directWalk(t *testing.T, x *Exports, names ...string) Node {
	t.Helper()
	return walk(t, x.Root(), names...)
}

func TestSpecialFilesAndXattrs(t *testing.T) {
	h := newHarness(t)
	dir := h.export(t, "rw", false, map[string]string{"f": "x"})
	root := directWalk(t, h.exports, "rw")

	_, err := root.Mknod("fifo", uint32(unix.S_IFIFO|0o644))
	require.NoError(t, err)
	st, err := os.Lstat(filepath.Join(dir, "fifo"))
	require.NoError(t, err)
	assert.Equal(t, os.ModeNamedPipe, st.Mode().Type())
	_, err = root.Mknod("dev", uint32(unix.S_IFCHR|0o644))
	assert.ErrorIs(t, err, unix.EPERM, "no device nodes")

	// A FIFO is never opened on the host (it would block the server).
	fifo, _, err := root.Walk("fifo")
	require.NoError(t, err)
	defer fifo.Close()
	_, err = fifo.Open(unix.O_RDONLY)
	assert.ErrorIs(t, err, unix.EPERM)

	f, attr, err := root.Walk("f")
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, int64(1), attr.Stat.Size)

	_, err = f.GetXattr("user.x")
	assert.ErrorIs(t, err, unix.ENODATA)
	names, err := f.ListXattrs()
	require.NoError(t, err)
	assert.Empty(t, names)
	assert.ErrorIs(t, f.SetXattr("user.x", []byte("v"), 0), unix.EOPNOTSUPP)
	assert.ErrorIs(t, f.RemoveXattr("user.x"), unix.EOPNOTSUPP)

	_, err = readAt(f, make([]byte, 1), 0)
	assert.ErrorIs(t, err, unix.EBADF, "read before open")
	assert.NoError(t, f.Sync(), "fsync of an unopened fid is a no-op")

	// Cross-export link refused.
	h.export(t, "other", false, nil)
	other := directWalk(t, h.exports, "other")
	assert.ErrorIs(t, other.Link(f, "l"), unix.EXDEV)
}
