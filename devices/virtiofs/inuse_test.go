package virtiofs

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// A hostile guest may send RELEASE (or FORGET) for a handle (or node)
// while another of its requests is still using it. Closing the file then
// would close a host descriptor under the running pread, pwrite or mkdirat,
// whose number the next open on the host may reuse: the request would then
// read, write or create through some other file. The table must close a
// file only once no request uses it.

// blockingFile is a hostfs.Node whose ReadvAt, WritevAt and Mkdir wait
// until released, and which records whether it was closed while one of
// them ran.
type blockingFile struct {
	hostfs.Node // nil: only the methods below are called

	entered chan struct{}
	proceed chan struct{}

	inUse          atomic.Bool
	closed         atomic.Bool
	closedWhileUse atomic.Bool
}

func newBlockingFile() *blockingFile {
	return &blockingFile{entered: make(chan struct{}, 1), proceed: make(chan struct{})}
}

func (f *blockingFile) block() {
	f.inUse.Store(true)
	f.entered <- struct{}{}
	<-f.proceed
	f.inUse.Store(false)
}

func (f *blockingFile) ReadvAt(iov [][]byte, _ int64) (int, error) {
	f.block()
	return copy(iov[0], "data"), nil
}

func (f *blockingFile) WritevAt(iov [][]byte, _ int64) (int, error) {
	f.block()
	return len(iov[0]), nil
}

func (f *blockingFile) Mkdir(string, uint32) (hostfs.Attr, error) {
	f.block()
	return hostfs.Attr{}, unix.EEXIST // stop before the lookup of the new name
}

func (f *blockingFile) Close() error {
	if f.inUse.Load() {
		f.closedWhileUse.Store(true)
	}
	f.closed.Store(true)
	return nil
}

func newTestFileSystem() *fileSystem {
	return newFileSystem(newBlockingFile(), Options{MaxNodes: 16, MaxHandles: 16})
}

func waitEntered(t *testing.T, f *blockingFile) {
	t.Helper()
	select {
	case <-f.entered:
	case <-time.After(waitLimit):
		t.Fatal("the operation never reached the file")
	}
}

func TestReleaseDuringReadClosesAfterTheRead(t *testing.T) {
	for _, op := range []string{"read", "write"} {
		t.Run(op, func(t *testing.T) {
			fsys := newTestFileSystem()
			bf := newBlockingFile()
			fh, st := fsys.t.open(bf, false)
			require.True(t, st.Ok())

			done := make(chan fuse.Status)
			go func() {
				if op == "read" {
					// The read runs when go-fuse fills the reply.
					rr, st := fsys.Read(nil, &fuse.ReadIn{Fh: fh, Size: 4}, make([]byte, 4))
					if st.Ok() {
						_, st = rr.Bytes(make([]byte, 4))
					}
					done <- st
					return
				}
				_, st := fsys.Writev(nil, &fuse.WriteIn{Fh: fh, Size: 1}, [][]byte{{'x'}})
				done <- st
			}()
			waitEntered(t, bf)

			fsys.Release(nil, &fuse.ReleaseIn{Fh: fh})
			require.False(t, bf.closed.Load(), "RELEASE closed the file under a running %s", op)
			_, handles := fsys.t.counts()
			require.Zero(t, handles, "the released handle is gone for new requests")
			_, st = fsys.t.handle(fh, false)
			require.Equal(t, fuse.EBADF, st)

			close(bf.proceed)
			require.Equal(t, fuse.OK, <-done)
			require.True(t, bf.closed.Load(), "closed once the %s ended", op)
			require.False(t, bf.closedWhileUse.Load())
		})
	}
}

func TestForgetDuringMkdirClosesAfterTheMkdir(t *testing.T) {
	fsys := newTestFileSystem()
	bf := newBlockingFile()
	id, st := fsys.t.add(hostfs.Key{Export: 1, Ino: 42}, bf, fuse.S_IFDIR)
	require.True(t, st.Ok())

	done := make(chan fuse.Status)
	go func() {
		done <- fsys.Mkdir(nil, &fuse.MkdirIn{InHeader: fuse.InHeader{NodeId: id}, Mode: 0o755}, "d", &fuse.EntryOut{})
	}()
	waitEntered(t, bf)

	fsys.Forget(id, 1)
	require.False(t, bf.closed.Load(), "FORGET closed the directory under a running MKDIR")
	_, st = fsys.t.node(id)
	require.Equal(t, fuse.Status(unix.ESTALE), st, "the forgotten node is gone for new requests")

	close(bf.proceed)
	require.Equal(t, fuse.Status(unix.EEXIST), <-done)
	require.True(t, bf.closed.Load(), "closed once the MKDIR ended")
	require.False(t, bf.closedWhileUse.Load())
}

// The same through the device, with the real export layer: batches of
// READ, WRITE and MKDIR race RELEASE and FORGET of the handles and nodes
// they use, beside OPENs of another file that could take a closed
// descriptor's number. Every request is answered, only with the errors
// a stale id may get, no write lands anywhere but in its own file, and
// every descriptor is closed at the end.
func TestForgetAndReleaseRacingRequests(t *testing.T) {
	r := newRig(t, Options{MaxInFlight: 16})
	r.initSession(t)
	baseline := openFds(t)
	dir := r.export(t, "e1", false, map[string]string{"f": "", "victim": "untouched", "d/.k": ""})
	victim := r.walk(t, "e1", "victim")
	q := r.drv.Queue(requestQueue)
	allowed := map[syscall.Errno]bool{0: true, syscall.EBADF: true, syscall.ESTALE: true, syscall.EEXIST: true}

	for round := range 40 {
		f := r.walk(t, "e1", "f")
		d := r.walk(t, "e1", "d")
		fh, errno := r.open(t, f, syscall.O_RDWR)
		require.Zero(t, errno)
		var n int
		opens := map[uint64]bool{}
		add := func(queue int, msg []byte, room uint32) {
			bufs := []virtiotest.Buffer{virtiotest.Readable(msg)}
			if room > 0 {
				bufs = append(bufs, virtiotest.Writable(room))
			}
			_, err := r.drv.Queue(queue).Add(bufs...)
			require.NoError(t, err)
			if queue == requestQueue {
				n++
			}
		}
		for i := range 12 {
			switch i % 4 {
			case 0:
				m, _ := r.encode(opWrite, f, &writeIn{Fh: fh, Offset: uint64(i), Size: 1}, []byte{'w'})
				add(requestQueue, m, 64)
			case 1:
				m, _ := r.encode(opRead, f, &readIn{Fh: fh, Size: 64})
				add(requestQueue, m, 128)
			case 2:
				m, _ := r.encode(opMkdir, d, &mkdirIn{Mode: 0o755}, cstr("m"+itoa(round)))
				add(requestQueue, m, 256)
			default:
				m, unique := r.encode(opOpen, victim, &openIn{Flags: syscall.O_RDONLY})
				add(requestQueue, m, 64)
				opens[unique] = true
			}
			if i == 5 {
				m, _ := r.encode(opRelease, f, &releaseIn{Fh: fh})
				add(requestQueue, m, 64)
				m, _ = r.encode(opForget, d, &struct{ N uint64 }{1 << 40})
				add(hiprioQueue, m, 0)
				m, _ = r.encode(opForget, f, &struct{ N uint64 }{1 << 40})
				add(hiprioQueue, m, 0)
			}
		}
		q.Kick()
		r.drv.Queue(hiprioQueue).Kick()
		used, err := q.WaitN(n, waitLimit)
		require.NoError(t, err)
		_, err = r.drv.Queue(hiprioQueue).WaitN(2, waitLimit)
		require.NoError(t, err)
		for _, u := range used {
			errno := errnoAt(t, u.Data)
			require.True(t, allowed[errno], "round %d: errno %v", round, errno)
			if opens[uniqueOf(u.Data)] && errno == 0 {
				var o fuse.OpenOut
				reply{payload: u.Data[16:]}.ok(t, &o)
				r.release(t, victim, o.Fh, opRelease)
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "victim"))
	require.NoError(t, err)
	require.Equal(t, "untouched", string(b), "no write reached another file")
	b, err = os.ReadFile(filepath.Join(dir, "f"))
	require.NoError(t, err)
	require.Regexp(t, `^[w\x00]*$`, string(b))
	_, handles := r.dev.Counts()
	require.Zero(t, handles)
	r.dev.Reset()
	r.exports.Remove("e1")
	require.Equal(t, baseline, openFds(t), "every descriptor closed, none twice")
}
