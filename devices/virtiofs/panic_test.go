package virtiofs

import (
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

// failingRoot is a Root whose attach root fails in StatFS: it panics, or
// ends its goroutine (runtime.Goexit) as a crashing file operation would.
// READLINK of it works, to show the device serves on.
type failingRoot struct {
	goexit bool
	calls  atomic.Int64
}

func (a *failingRoot) Root() hostfs.Node { return &failingRootFile{a: a} }

func (a *failingRoot) SyncWritable() error { return nil }

type failingRootFile struct {
	hostfs.Node // nil: only the methods below are called
	a           *failingRoot
}

func (f *failingRootFile) StatFS() (unix.Statfs_t, error) {
	f.a.calls.Add(1)
	if f.a.goexit {
		runtime.Goexit()
	}
	panic("failingRootFile: StatFS")
}

func (f *failingRootFile) Readlink() (string, error) { return "still serving", nil }

func (f *failingRootFile) Walk(string) (hostfs.Node, hostfs.Attr, error) {
	return nil, hostfs.Attr{}, unix.ENOENT
}

func (f *failingRootFile) Close() error { return nil }

func newFailingRig(t *testing.T, goexit bool) (*rig, *failingRoot, *ratelogtest.LogBuffer) {
	t.Helper()
	logs := &ratelogtest.LogBuffer{}
	root := &failingRoot{goexit: goexit}
	dev, err := New(Options{Tag: "failing", Root: root, Logger: logs.Logger()})
	require.NoError(t, err)
	r := &rig{dev: dev}
	r.drv = virtiotest.Start(t, dev, virtiotest.Options{MemSize: 16 << 20})
	t.Cleanup(dev.Close)
	r.initSession(t)
	return r, root, logs
}

// A panic in a file operation is EIO for that request only; the device
// serves on, and the panic is logged as the device's error (with its
// stack), never folded into the rate-limited warnings about the guest.
func TestPanicInAFileOperationIsEIOAndTheDeviceServesOn(t *testing.T) {
	r, root, logs := newFailingRig(t, false)
	for i := range 3 {
		_, errno := r.statfs(t, fuse.FUSE_ROOT_ID)
		require.Equal(t, syscall.EIO, errno, "round %d", i)
		target, errno := r.readlink(t, fuse.FUSE_ROOT_ID)
		require.Zero(t, errno, "the next request is answered")
		require.Equal(t, "still serving", target)
	}
	require.EqualValues(t, 3, root.calls.Load())
	require.Zero(t, r.drv.Status()&virtio.StatusDeviceNeedsReset, "a panic does not break the device")
	lines := logs.Lines("level=ERROR")
	require.Len(t, lines, 3, logs.String())
	require.Contains(t, lines[0], "failingRootFile: StatFS")
	require.Contains(t, lines[0], "(*fileSystem).StatFs", "the stack names the operation")
}

// A file operation that ends its goroutine (runtime.Goexit) still gets its
// request answered (EIO), so the guest is not left waiting, and the device
// serves on and resets.
func TestGoexitInAFileOperationIsAnswered(t *testing.T) {
	r, root, _ := newFailingRig(t, true)
	msg, unique := r.encode(opStatfs, fuse.FUSE_ROOT_ID, nil)
	q := r.drv.Queue(requestQueue)
	_, err := q.Add(virtiotest.Readable(msg), virtiotest.Writable(4096))
	require.NoError(t, err)
	q.Kick()
	u, err := q.Wait(2 * time.Second)
	require.NoError(t, err, "the request was left pending")
	require.True(t, isErrorHeader(u.Data, unique, syscall.EIO), "got %x", u.Data)
	require.EqualValues(t, 1, root.calls.Load())

	target, errno := r.readlink(t, fuse.FUSE_ROOT_ID)
	require.Zero(t, errno)
	require.Equal(t, "still serving", target)
	done := make(chan struct{})
	go func() { r.dev.Reset(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitLimit):
		t.Fatal("Reset did not return")
	}
}
