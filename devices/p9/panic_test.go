package p9

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

// failingFS is an Attacher whose files fail on one chosen operation: they
// panic in it, or end their goroutine (runtime.Goexit) as a crashing
// server goroutine would.
type failingFS struct {
	*fakeFS
	op     string // "ReadAt", "Walk" or "StatFS"
	goexit bool
	calls  atomic.Int64 // of op
}

func (a *failingFS) Attach() (p9lib.File, error) {
	a.open.Add(1)
	return &failingFile{fakeFile: fakeFile{fs: a.fakeFS}, a: a}, nil
}

type failingFile struct {
	fakeFile
	a *failingFS
}

func (f *failingFile) fail(op string) {
	if op != f.a.op {
		return
	}
	f.a.calls.Add(1)
	if f.a.goexit {
		runtime.Goexit()
	}
	panic("failingFile: " + op)
}

func (f *failingFile) Walk(names []string) ([]p9lib.QID, p9lib.File, error) {
	f.fail("Walk")
	if len(names) != 0 {
		return nil, nil, linux.ENOENT
	}
	f.a.open.Add(1)
	return nil, &failingFile{fakeFile: fakeFile{fs: f.a.fakeFS}, a: f.a}, nil
}

func (f *failingFile) StatFS() (p9lib.FSStat, error) {
	f.fail("StatFS")
	return p9lib.FSStat{Type: 0x01021997, BlockSize: 4096}, nil
}

func (f *failingFile) ReadAt(p []byte, off int64) (int, error) {
	f.fail("ReadAt")
	return f.fakeFile.ReadAt(p, off)
}

// failingRig is a device serving a failingFS, with its log.
type failingRig struct {
	fs   *failingFS
	dev  *Device
	drv  *virtiotest.Driver
	q    *virtiotest.DriverQueue
	logs *ratelogtest.LogBuffer
}

func newFailingRig(t *testing.T, op string, goexit bool) *failingRig {
	t.Helper()
	r := &failingRig{fs: &failingFS{fakeFS: fakeAttacher(nil), op: op, goexit: goexit}, logs: &ratelogtest.LogBuffer{}}
	dev, err := New(Options{Tag: "failing", Attacher: r.fs, Logger: r.logs.Logger()})
	require.NoError(t, err)
	t.Cleanup(dev.Close)
	r.dev = dev
	r.drv = newDriverFor(t, dev)
	r.q = r.drv.Queue(0)
	return r
}

// send queues one message and returns its reply.
func (r *failingRig) send(t *testing.T, msg []byte) []byte {
	t.Helper()
	_, err := r.q.Add(vtReadable(msg), vtWritable(4096))
	require.NoError(t, err)
	r.q.Kick()
	u, err := r.q.Wait(waitLimit)
	require.NoError(t, err)
	return u.Data
}

// open negotiates, attaches fid 1 and opens it.
func (r *failingRig) open(t *testing.T) {
	t.Helper()
	typ, _, _ := replyOf(t, r.send(t, message(msgTversion, noTag, cat(le32(8192), str9("9P2000.L")))))
	require.Equal(t, uint8(msgRversion), typ)
	typ, _, _ = replyOf(t, r.send(t, message(msgTattach, 1, cat(le32(1), le32(noFid), str9(""), str9(""), le32(0)))))
	require.Equal(t, uint8(msgTattach+1), typ, "Rattach")
	typ, _, _ = replyOf(t, r.send(t, message(msgTlopen, 2, cat(le32(1), le32(0)))))
	require.Equal(t, uint8(msgTlopen+1), typ, "Rlopen")
}

func tread(tag uint16) []byte    { return message(msgTread, tag, cat(le32(1), le64(0), le32(10))) }
func tgetattr(tag uint16) []byte { return message(msgTgetattr, tag, cat(le32(1), le64(0x7ff))) }
func tstatfs(tag uint16) []byte  { return message(msgTstatfs, tag, le32(1)) }

func TestFileOperationPanicIsEIOAndTheDeviceKeepsServing(t *testing.T) {
	for _, op := range []string{"ReadAt", "StatFS"} {
		t.Run(op, func(t *testing.T) {
			r := newFailingRig(t, op, false)
			r.open(t)
			failing, working := tread(3), tstatfs(4)
			if op == "StatFS" {
				failing, working = tstatfs(3), tread(4)
			}
			for range 3 {
				assertRlerror(t, r.send(t, failing), 3, linux.EIO)
				typ, tag, _ := replyOf(t, r.send(t, working))
				assert.NotEqual(t, uint8(msgRlerror), typ, "the next request is answered")
				assert.Equal(t, uint16(4), tag)
			}
			assert.EqualValues(t, 3, r.fs.calls.Load())
			assert.Zero(t, r.drv.Status()&virtio.StatusDeviceNeedsReset, "a handler's panic does not break the device")
			lines := r.logs.Lines("virtio-9p: a file operation panicked; answering EIO")
			require.Len(t, lines, 3, r.logs.String())
			assert.Contains(t, lines[0], "op="+op)
			assert.Contains(t, lines[0], "panic=\"failingFile: "+op+"\"")
		})
	}
}

func TestPanicInAWalkIsEIO(t *testing.T) {
	r := newFailingRig(t, "Walk", false)
	r.open(t)
	walk := message(msgTwalk, 5, cat(le32(1), le32(2), []byte{0, 0})) // fid 1 → new fid 2, no names
	assertRlerror(t, r.send(t, walk), 5, linux.EIO)
	typ, _, _ := replyOf(t, r.send(t, tread(6)))
	assert.Equal(t, uint8(msgTread+1), typ, "Rread")
}

func TestServerGoroutineDeathFailsRequestsAndNeedsReset(t *testing.T) {
	r := newFailingRig(t, "ReadAt", true)
	r.open(t)
	require.EqualValues(t, 1, r.fs.open.Load(), "the attached fid's file is open")

	assertRlerror(t, r.send(t, tread(3)), 3, linux.EIO)
	assert.NotZero(t, r.drv.Status()&virtio.StatusDeviceNeedsReset, "DEVICE_NEEDS_RESET")
	assert.Zero(t, r.fs.open.Load(), "the dead server's files are closed")
	assert.NotEmpty(t, r.logs.Lines("the 9P server connection died"), r.logs.String())

	// After the driver resets the device, a new server serves it.
	r.drv.Reset()
	// Fresh RAM for the rebooted guest's rings (as TestResetClunksEveryFid).
	require.NoError(t, r.drv.Mem.WriteAt(make([]byte, r.drv.Mem.Size()), 0))
	require.NoError(t, r.drv.Init())
	r.q = r.drv.Queue(0)
	r.open(t)
	typ, tag, _ := replyOf(t, r.send(t, tgetattr(7)))
	assert.Equal(t, uint8(msgTgetattr+1), typ, "Rgetattr from the new server")
	assert.Equal(t, uint16(7), tag)
}

func TestQueuedRequestsOfADeadServerGetEIO(t *testing.T) {
	r := newFailingRig(t, "ReadAt", true)
	r.open(t)
	// The Tread kills the server; the Tgetattr queued behind it is
	// answered by the device with EIO — unless the server, which serves
	// requests concurrently, answered it before the Tread's death (then
	// it is a real Rgetattr). Either way no request is left unanswered.
	for _, m := range [][]byte{tread(3), tgetattr(4)} {
		_, err := r.q.Add(vtReadable(m), vtWritable(4096))
		require.NoError(t, err)
	}
	r.q.Kick()
	used, err := r.q.WaitN(2, waitLimit)
	require.NoError(t, err)
	for _, u := range used {
		typ, tag, _ := replyOf(t, u.Data)
		if tag == 4 && typ == msgTgetattr+1 {
			continue // served before the server died
		}
		assertRlerror(t, u.Data, tag, linux.EIO)
	}
	// The worker marks the device once it sees the server dead, which
	// may be just after the replies.
	require.Eventually(t, func() bool { return r.drv.Status()&virtio.StatusDeviceNeedsReset != 0 },
		waitLimit, time.Millisecond, "DEVICE_NEEDS_RESET")
}

func TestServingRecoversPanicsAndGoroutineExits(t *testing.T) {
	for name, fn := range map[string]func(){
		"panic":  func() { panic("boom") },
		"goexit": runtime.Goexit,
	} {
		t.Run(name, func(t *testing.T) {
			logs := &ratelogtest.LogBuffer{}
			dev, err := New(Options{Tag: "t", Attacher: fakeAttacher(nil), Logger: logs.Logger()})
			require.NoError(t, err)
			defer dev.Close()
			b := dev.bridge
			panicked := make(chan bool, 1)
			go func() { panicked <- b.serving("in a test", fn) }() // a goexit stays parked
			select {
			case <-b.dead:
			case <-time.After(waitLimit):
				t.Fatal("the bridge was not failed")
			}
			if name == "panic" {
				assert.True(t, <-panicked)
			}
			assert.NotEmpty(t, logs.Lines("the 9P server connection died"), logs.String())
			assert.True(t, b.serving("after", func() {}) == false, "a normal return is nothing")
		})
	}
}
