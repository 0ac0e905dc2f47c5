package virtiofs

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// exports.Remove of an export the guest uses: every node and handle it
// holds fails with ESTALE at once, every host descriptor of the export is
// closed before Remove returns (not when the guest forgets and releases),
// and forgetting and releasing later closes nothing twice.
func TestRemovedExportFailsEveryHeldNodeAndHandle(t *testing.T) {
	r := newRig(t, Options{})
	r.initSession(t)
	baseline := openFds(t)
	dir := r.export(t, "rw", false, map[string]string{"f.txt": "data", "sub/g.txt": "more", "sub/empty/.k": ""})
	require.NoError(t, os.Symlink("f.txt", filepath.Join(dir, "lnk")))

	exp := r.walk(t, "rw")
	f := r.walk(t, "rw", "f.txt")
	sub := r.walk(t, "rw", "sub")
	deep := r.walk(t, "rw", "sub", "g.txt")
	lnk := r.walk(t, "rw", "lnk")
	wfh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	rfh, errno := r.open(t, deep, syscall.O_RDONLY)
	require.Zero(t, errno)
	dh, errno := r.opendir(t, sub)
	require.Zero(t, errno)
	require.NotEmpty(t, r.listDir(t, sub, dh.Fh, opReaddirplus, 4096)) // looks the entries up too
	held := openFds(t)
	require.Greater(t, held, baseline+8, "the guest's nodes and handles hold host descriptors")
	nodes, handles := r.dev.Counts()
	before := snapshot(t, dir)

	r.exports.Remove("rw")
	require.Equal(t, baseline, openFds(t), "every descriptor of the export closed by Remove")

	stale := map[string]func() syscall.Errno{
		"read":        func() syscall.Errno { _, e := r.read(t, deep, rfh, 0, 10); return e },
		"write":       func() syscall.Errno { _, e := r.write(t, f, wfh, 0, []byte("DATA")); return e },
		"readdir":     func() syscall.Errno { return r.call(t, opReaddir, sub, &readIn{Fh: dh.Fh, Size: 4096}).errno },
		"readdirplus": func() syscall.Errno { return r.call(t, opReaddirplus, sub, &readIn{Fh: dh.Fh, Size: 4096}).errno },
		"lookup":      func() syscall.Errno { _, e := r.lookup(t, sub, "g.txt"); return e },
		"lookup-root": func() syscall.Errno { _, e := r.lookup(t, exp, "f.txt"); return e },
		"getattr":     func() syscall.Errno { _, e := r.getattr(t, deep); return e },
		"getattr-dir": func() syscall.Errno { _, e := r.getattr(t, exp); return e },
		"setattr":     func() syscall.Errno { _, e := r.setattr(t, f, setattrIn{Valid: fuse.FATTR_SIZE}); return e },
		"create":      func() syscall.Errno { _, e := r.create(t, sub, "new", syscall.O_RDWR, 0o644); return e },
		"mkdir":       func() syscall.Errno { _, e := r.mkdir(t, exp, "new", 0o755); return e },
		"mknod":       func() syscall.Errno { _, e := r.mknod(t, exp, "new", syscall.S_IFIFO|0o644, 0); return e },
		"symlink":     func() syscall.Errno { _, e := r.symlink(t, exp, "new", "x"); return e },
		"link":        func() syscall.Errno { _, e := r.link(t, f, sub, "new"); return e },
		"unlink":      func() syscall.Errno { return r.unlink(t, exp, "f.txt") },
		"rmdir":       func() syscall.Errno { return r.rmdir(t, sub, "empty") },
		"rename":      func() syscall.Errno { return r.rename(t, exp, "f.txt", sub, "moved") },
		"open":        func() syscall.Errno { _, e := r.open(t, f, syscall.O_RDONLY); return e },
		"opendir":     func() syscall.Errno { _, e := r.opendir(t, sub); return e },
		"fsync":       func() syscall.Errno { return r.fsync(t, f, wfh, opFsync) },
		"fsyncdir":    func() syscall.Errno { return r.fsync(t, sub, dh.Fh, opFsyncdir) },
		"statfs":      func() syscall.Errno { _, e := r.statfs(t, sub); return e },
		"readlink":    func() syscall.Errno { _, e := r.readlink(t, lnk); return e },
	}
	for name, op := range stale {
		require.Equal(t, syscall.ESTALE, op(), name)
	}
	require.Equal(t, baseline, openFds(t), "no failed request opened anything")
	require.Equal(t, before, snapshot(t, dir), "nothing reached the host after the removal")
	_, errno = r.lookup(t, fuse.FUSE_ROOT_ID, "rw")
	require.Equal(t, syscall.ENOENT, errno, "the export is gone from the list")
	n2, h2 := r.dev.Counts()
	require.Equal(t, nodes, n2, "the guest's ids stay until it forgets and releases them")
	require.Equal(t, handles, h2)

	// Releasing and forgetting afterwards closes nothing twice (a double
	// close would take a descriptor from someone else: the count would
	// drop below the baseline).
	r.release(t, f, wfh, opRelease)
	r.release(t, deep, rfh, opRelease)
	r.release(t, sub, dh.Fh, opReleasedir)
	for _, id := range []uint64{exp, f, sub, deep, lnk} {
		r.forget(t, id, 1<<40)
	}
	require.Equal(t, baseline, openFds(t))
	n3, h3 := r.dev.Counts()
	require.Zero(t, h3)
	require.Less(t, n3, n2)

	// The same host directory exported again, read-only this time: new
	// nodes, the old ids stay stale.
	require.NoError(t, r.exports.Add("rw", dir, true))
	again, errno := r.lookup(t, fuse.FUSE_ROOT_ID, "rw")
	require.Zero(t, errno)
	require.Greater(t, again.NodeId, lnk, "a new node, never an old id")
	g, errno := r.lookup(t, again.NodeId, "f.txt")
	require.Zero(t, errno)
	_, errno = r.open(t, g.NodeId, syscall.O_RDWR)
	require.Equal(t, syscall.EROFS, errno, "the new export is read-only")
	_, errno = r.read(t, deep, rfh, 0, 10)
	require.Equal(t, syscall.EBADF, errno)
	_, errno = r.getattr(t, sub)
	require.Equal(t, syscall.ESTALE, errno)
}

// exports.Remove while the guest keeps requests in flight: each is
// answered, with success before the removal and ESTALE after (never
// another file's data), and every descriptor is closed at the end.
func TestRemoveDuringRequestsInFlight(t *testing.T) {
	r := newRig(t, Options{MaxInFlight: 8})
	r.initSession(t)
	baseline := openFds(t)
	r.export(t, "busy", false, map[string]string{"f": "0123456789"})
	f := r.walk(t, "busy", "f")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	busy := r.walk(t, "busy")

	q := r.drv.Queue(requestQueue)
	var removed sync.WaitGroup
	removed.Add(1)
	sawStale := false
	for round := 0; round < 200 && !sawStale; round++ {
		if round == 3 {
			go func() { defer removed.Done(); r.exports.Remove("busy") }()
		}
		var uniques []uint64
		reads := map[uint64]bool{}
		for i := range 16 {
			var msg []byte
			var unique uint64
			switch i % 4 {
			case 0:
				msg, unique = r.encode(opRead, f, &readIn{Fh: fh, Size: 10})
				reads[unique] = true
			case 1:
				msg, unique = r.encode(opWrite, f, &writeIn{Fh: fh, Offset: 0, Size: 1}, []byte("x"))
			case 2:
				msg, unique = r.encode(opLookup, busy, nil, cstr("f"))
			default:
				msg, unique = r.encode(opGetattr, f, &getattrIn{})
			}
			_, err := q.Add(virtiotest.Readable(msg), virtiotest.Writable(4096))
			require.NoError(t, err)
			uniques = append(uniques, unique)
		}
		q.Kick()
		used, err := q.WaitN(len(uniques), waitLimit)
		require.NoError(t, err, "every request answered")
		for _, u := range used {
			require.GreaterOrEqual(t, len(u.Data), 16)
			var h fuse.OutHeader
			require.NoError(t, binary.Read(bytes.NewReader(u.Data), binary.LittleEndian, &h))
			require.Contains(t, uniques, h.Unique)
			errno := syscall.Errno(-h.Status)
			require.Contains(t, []syscall.Errno{0, syscall.ESTALE}, errno, "round %d", round)
			if errno == syscall.ESTALE {
				sawStale = true
			}
			if errno == 0 && reads[h.Unique] {
				require.Regexp(t, `^[x0-9]*$`, string(u.Data[16:]), "a READ returns the file's own bytes")
			}
		}
	}
	removed.Wait()
	require.True(t, sawStale, "the removal reached the requests")
	_, errno = r.read(t, f, fh, 0, 10)
	require.Equal(t, syscall.ESTALE, errno)
	r.release(t, f, fh, opRelease)
	r.dev.Reset()
	require.Equal(t, baseline, openFds(t), "every descriptor closed")
}
