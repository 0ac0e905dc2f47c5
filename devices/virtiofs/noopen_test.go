package virtiofs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// A NoOpen device's guest opens files without asking: OPEN is ENOSYS
// (which makes Linux stop sending OPEN and RELEASE), and its READs carry
// handle 0 and name the node, read through a file the node keeps.
func TestNoOpenReadsByNode(t *testing.T) {
	r := newRig(t, Options{Cached: true, NoOpen: true})
	dir := r.export(t, "e1", true, map[string]string{"f": "hello, no open", "d/g": "x"})
	r.initSession(t)
	e1 := r.walk(t, "e1")
	f, errno := r.lookup(t, e1, "f")
	require.Zero(t, errno)

	_, errno = r.open(t, f.NodeId, syscall.O_RDONLY)
	require.Equal(t, syscall.ENOSYS, errno, "OPEN")
	got, errno := r.read(t, f.NodeId, 0, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "hello, no open", string(got))
	got, errno = r.read(t, f.NodeId, 0, 7, 100)
	require.Zero(t, errno)
	require.Equal(t, "no open", string(got))
	require.Equal(t, 3, hostDescriptors(t, filepath.Join(dir, "f")), "the node's own and its reader's two (a clone, opened), as an open handle has")

	require.Equal(t, syscall.ENOSYS, r.flush(t, f.NodeId, 0), "FLUSH")
	require.Equal(t, syscall.ENOSYS, r.fsync(t, f.NodeId, 0, opFsync), "FSYNC")
	_, errno = r.write(t, f.NodeId, 0, 0, []byte("x"))
	require.Equal(t, syscall.EBADF, errno, "WRITE")

	d, errno := r.lookup(t, e1, "d")
	require.Zero(t, errno)
	_, errno = r.read(t, d.NodeId, 0, 0, 100)
	require.Equal(t, syscall.EISDIR, errno, "READ of a directory")
	_, errno = r.read(t, 1<<40, 0, 0, 100)
	require.Equal(t, syscall.ESTALE, errno, "READ of an unknown node")

	r.forget(t, f.NodeId, 1)
	require.Zero(t, hostDescriptors(t, filepath.Join(dir, "f")), "FORGET closes the reader too")
	_, errno = r.read(t, f.NodeId, 0, 0, 100)
	require.Equal(t, syscall.ESTALE, errno, "READ after FORGET")
}

// The nodes keeping a reader are bounded by MaxHandles; beyond it each
// READ opens and closes its own.
func TestNoOpenReadersAreBounded(t *testing.T) {
	r := newRig(t, Options{Cached: true, NoOpen: true, MaxHandles: 1})
	dir := r.export(t, "e1", true, map[string]string{"a": "first", "b": "second"})
	r.initSession(t)
	e1 := r.walk(t, "e1")
	for _, name := range []string{"a", "b", "a", "b"} {
		e, errno := r.lookup(t, e1, name)
		require.Zero(t, errno)
		got, errno := r.read(t, e.NodeId, 0, 0, 100)
		require.Zero(t, errno)
		require.Equal(t, map[string]string{"a": "first", "b": "second"}[name], string(got))
	}
	require.Equal(t, 3, hostDescriptors(t, filepath.Join(dir, "a")), "a keeps its reader")
	require.Equal(t, 1, hostDescriptors(t, filepath.Join(dir, "b")), "b's readers were closed after each READ")
}

// Handle 0 means "opened without asking" only on a NoOpen device; on
// others it is no handle.
func TestHandleZeroIsNoHandleWithoutNoOpen(t *testing.T) {
	for _, opts := range []Options{{}, {Cached: true}} {
		r := newRig(t, opts)
		r.export(t, "e1", true, map[string]string{"f": "data"})
		r.initSession(t)
		f, errno := r.lookup(t, r.walk(t, "e1"), "f")
		require.Zero(t, errno)
		_, errno = r.read(t, f.NodeId, 0, 0, 100)
		require.Equal(t, syscall.EBADF, errno, "%+v", opts)
		require.Equal(t, syscall.EBADF, r.flush(t, f.NodeId, 0), "%+v", opts)
	}
}

// hostDescriptors counts this process's descriptors open on path.
func hostDescriptors(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == path {
			n++
		}
	}
	return n
}

// FuzzNoOpenRead sends READs with handle 0 (a file opened without asking)
// for any node, offset and size: each answers an error or exactly the
// bytes of the node's file there.
func FuzzNoOpenRead(f *testing.F) {
	r := newRig(f, Options{Cached: true, NoOpen: true, MaxNodes: 16, MaxHandles: 1})
	r.export(f, "e1", true, map[string]string{"f": "content", "d/g": "more"})
	r.initSession(f)
	want := map[uint64]string{r.walk(f, "e1", "f"): "content", r.walk(f, "e1", "d", "g"): "more"}
	for node := range want {
		f.Add(node, uint64(0), uint32(4096))
		f.Add(node, uint64(3), uint32(2))
	}
	f.Add(uint64(1), uint64(0), uint32(10))
	f.Add(uint64(1<<63), uint64(1<<63), uint32(1<<31))
	f.Fuzz(func(t *testing.T, node, off uint64, size uint32) {
		got, errno := r.read(t, node, 0, off, size%8192)
		content, isFile := want[node]
		if errno != 0 {
			require.False(t, isFile && off <= 1<<62, "READ of %d at %d: %v", node, off, errno)
			return
		}
		require.True(t, isFile, "READ of node %d answered", node)
		end := min(off+uint64(size%8192), uint64(len(content)))
		if off >= end {
			require.Empty(t, got)
			return
		}
		require.Equal(t, content[off:end], string(got))
	})
}

// A ListNamesOnly device does not offer READDIRPLUS, so the guest lists
// its directories with READDIR: names, no host lookup per entry.
func TestListNamesOnly(t *testing.T) {
	for _, namesOnly := range []bool{false, true} {
		r := newRig(t, Options{Cached: true, ListNamesOnly: namesOnly})
		r.export(t, "e1", true, map[string]string{"a": "1", "d/b": "2"})
		init := r.initSession(t)
		require.Equal(t, !namesOnly, init.Flags&uint32(fuse.CAP_READDIRPLUS) != 0, "READDIRPLUS offered, ListNamesOnly %v", namesOnly)
		e1 := r.walk(t, "e1")
		o, errno := r.opendir(t, e1)
		require.Zero(t, errno)
		require.ElementsMatch(t, []string{".", "..", "a", "d"}, r.readdir(t, e1, o.Fh, opReaddir))
		nodes, _ := r.dev.session.fs.t.counts()
		require.Equal(t, 2, nodes, "the root and e1: a listing looks nothing up")
	}
}
