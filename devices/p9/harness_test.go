package p9

import (
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	p9lib "github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/devices/hostfs/hostfstest"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// testMsize is the msize the test client negotiates.
const testMsize = 64 * 1024

// waitLimit only keeps a broken test from hanging.
const waitLimit = 20 * time.Second

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// rig is a device behind the test driver, with exports in a temp dir.
type rig struct {
	dir     string
	exports *hostfs.Exports
	dev     *Device
	drv     *virtiotest.Driver
	q       *virtiotest.DriverQueue
}

func newRig(t testing.TB, opts Options) *rig {
	t.Helper()
	return newRigOver(t, opts, hostfs.NewExports(discardLogger()))
}

// newRigOver is newRig over exports of the caller's (a budget of its own).
func newRigOver(t testing.TB, opts Options, exports *hostfs.Exports) *rig {
	t.Helper()
	r := &rig{dir: t.TempDir(), exports: exports}
	if opts.Tag == "" {
		opts.Tag = "cowork"
	}
	opts.Attacher = ExportsAttacher(r.exports)
	if opts.Logger == nil {
		opts.Logger = discardLogger()
	}
	dev, err := New(opts)
	require.NoError(t, err)
	r.dev = dev
	r.drv = virtiotest.Start(t, dev, virtiotest.Options{MemSize: 64 << 20})
	r.q = r.drv.Queue(0)
	t.Cleanup(func() {
		dev.Close()
		r.exports.Close()
	})
	return r
}

func (r *rig) export(t testing.TB, name string, readOnly bool, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(r.dir, name)
	hostfstest.WriteTree(t, dir, files)
	require.NoError(t, r.exports.Add(name, dir, readOnly))
	return dir
}

// roundTrip sends one raw message in its own chain and returns the reply.
func (r *rig) roundTrip(t testing.TB, msg []byte, writable uint32) virtiotest.Used {
	t.Helper()
	_, err := r.q.Add(virtiotest.Readable(msg), virtiotest.Writable(writable))
	require.NoError(t, err)
	r.q.Kick()
	u, err := r.q.Wait(waitLimit)
	require.NoError(t, err)
	return u
}

// client returns a hugelgupf/p9 client whose messages travel as chains.
func (r *rig) client(t testing.TB) *p9lib.Client {
	t.Helper()
	conn := newChainConn(r.q)
	c, err := p9lib.NewClient(conn, p9lib.WithMessageSize(testMsize))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Close()
		conn.Close()
	})
	return c
}

// chainConn carries a p9 client's byte stream over the virtqueue: each
// complete T-message becomes one chain (readable: the message; writable:
// testMsize), each used chain's data is fed back as the reply stream.
type chainConn struct {
	q *virtiotest.DriverQueue

	mu   sync.Mutex
	wbuf []byte

	pr        *io.PipeReader
	pw        *io.PipeWriter
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newChainConn(q *virtiotest.DriverQueue) *chainConn {
	pr, pw := io.Pipe()
	c := &chainConn{q: q, pr: pr, pw: pw, stop: make(chan struct{}), done: make(chan struct{})}
	go c.collect()
	return c
}

func (c *chainConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wbuf = append(c.wbuf, p...)
	for len(c.wbuf) >= 4 {
		size := int(binary.LittleEndian.Uint32(c.wbuf))
		if len(c.wbuf) < size {
			break
		}
		msg := c.wbuf[:size]
		if _, err := c.q.Add(virtiotest.Readable(msg), virtiotest.Writable(testMsize)); err != nil {
			return 0, err
		}
		c.q.Kick()
		c.wbuf = append([]byte(nil), c.wbuf[size:]...)
	}
	return len(p), nil
}

func (c *chainConn) collect() {
	defer close(c.done)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		u, err := c.q.Wait(50 * time.Millisecond)
		if errors.Is(err, virtiotest.ErrTimeout) {
			continue
		}
		if err != nil {
			_ = c.pw.CloseWithError(err)
			return
		}
		if _, err := c.pw.Write(u.Data); err != nil {
			return
		}
	}
}

func (c *chainConn) Read(p []byte) (int, error) { return c.pr.Read(p) }

func (c *chainConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.stop)
		_ = c.pr.Close()
		<-c.done
	})
	return nil
}
