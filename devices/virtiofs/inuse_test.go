package virtiofs

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/p9/fs"
)

// A hostile guest may send RELEASE (or FORGET) for a handle (or node)
// while another of its requests is still using it. Closing the file then
// would close a host descriptor under the running pread, pwrite or mkdirat,
// whose number the next open on the host may reuse: the request would then
// read, write or create through some other file. The table must close a
// file only once no request uses it.

// blockingFile is a p9.File whose ReadAt, WriteAt and Mkdir wait until
// released, and which records whether it was closed while one of them ran.
type blockingFile struct {
	p9.File // nil: only the methods below are called

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

func (f *blockingFile) ReadAt(p []byte, _ int64) (int, error) {
	f.block()
	return copy(p, "data"), nil
}

func (f *blockingFile) WriteAt(p []byte, _ int64) (int, error) {
	f.block()
	return len(p), nil
}

func (f *blockingFile) Mkdir(string, p9.FileMode, p9.UID, p9.GID) (p9.QID, error) {
	f.block()
	return p9.QID{}, linux.EEXIST // stop before the lookup of the new name
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
					_, st := fsys.Read(nil, &fuse.ReadIn{Fh: fh, Size: 4}, make([]byte, 4))
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
	id, st := fsys.t.add(fs.NodeKey{Export: 1, Ino: 42}, bf, fuse.S_IFDIR)
	require.True(t, st.Ok())

	done := make(chan fuse.Status)
	go func() {
		done <- fsys.Mkdir(nil, &fuse.MkdirIn{InHeader: fuse.InHeader{NodeId: id}, Mode: 0o755}, "d", &fuse.EntryOut{})
	}()
	waitEntered(t, bf)

	fsys.Forget(id, 1)
	require.False(t, bf.closed.Load(), "FORGET closed the directory under a running MKDIR")
	_, st = fsys.t.node(id)
	require.Equal(t, fuse.Status(linux.ESTALE), st, "the forgotten node is gone for new requests")

	close(bf.proceed)
	require.Equal(t, fuse.Status(linux.EEXIST), <-done)
	require.True(t, bf.closed.Load(), "closed once the MKDIR ended")
	require.False(t, bf.closedWhileUse.Load())
}
