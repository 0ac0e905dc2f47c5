package virtiofs

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// plainMemory is guest memory that cannot be mapped (no virtio.Slicer):
// the device copies each request into a bounce buffer and the reply out
// of one.
type plainMemory struct{ m *virtio.SliceMemory }

func (p plainMemory) ReadAt(b []byte, gpa uint64) error  { return p.m.ReadAt(b, gpa) }
func (p plainMemory) WriteAt(b []byte, gpa uint64) error { return p.m.WriteAt(b, gpa) }

// newBounceRig is newRig over memory the device cannot map.
func newBounceRig(t *testing.T, opts Options) *rig {
	t.Helper()
	r := &rig{dir: t.TempDir(), exports: hostfs.NewExports(discardLogger())}
	opts.Tag, opts.Root, opts.Logger = "bounce", r.exports, discardLogger()
	dev, err := New(opts)
	require.NoError(t, err)
	r.dev = dev
	mem := virtio.NewSliceMemory(64 << 20)
	irq := virtiotest.NewIRQ()
	mmio := virtio.NewMMIO(dev, plainMemory{mem}, irq, virtio.MMIOOptions{Logger: discardLogger()})
	r.drv = virtiotest.NewDriver(mmio, mem, irq)
	require.NoError(t, r.drv.Init())
	t.Cleanup(func() {
		r.drv.Reset()
		dev.Close()
		r.exports.Close()
	})
	return r
}

// Without a Slicer every request goes through bounce buffers: the same
// results, split buffers included, and the same bounds.
func TestBounceBuffersWithoutASlicer(t *testing.T) {
	r := newBounceRig(t, Options{})
	content := bytes.Repeat([]byte("0123456789"), 3000)
	dir := r.export(t, "e1", false, map[string]string{"f": string(content)})
	r.initSession(t)
	r.dev.mu.Lock()
	require.Nil(t, r.dev.session.slicer, "the bounce path")
	r.dev.mu.Unlock()
	e1 := r.walk(t, "e1")
	f := r.walk(t, "e1", "f")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)

	data, errno := r.read(t, f, fh, 7, 20000)
	require.Zero(t, errno)
	require.Equal(t, content[7:20007], data)
	_, errno = r.write(t, f, fh, 0, []byte("HELLO"))
	require.Zero(t, errno)
	got, _ := os.ReadFile(filepath.Join(dir, "f"))
	require.Equal(t, "HELLO56789", string(got[:10]))

	// Split request and reply.
	msg, unique := r.encode(opRead, f, &readIn{Fh: fh, Offset: 0, Size: 5000})
	u := r.sendBufs(t, requestQueue, []virtiotest.Buffer{
		virtiotest.Readable(msg[:7]), virtiotest.Readable(msg[7:]),
		virtiotest.Writable(3), virtiotest.Writable(2000), virtiotest.Writable(3100),
	})
	require.EqualValues(t, 5016, u.Len)
	require.Equal(t, unique, uniqueOf(u.Data))
	require.Equal(t, append([]byte("HELLO"), content[5:5000]...), u.Data[16:])

	// Too little room: an error header; none: nothing.
	msg, unique = r.encode(opLookup, e1, nil, cstr("f"))
	u = r.send(t, requestQueue, msg, 20)
	require.True(t, isErrorHeader(u.Data, unique, syscall.EIO))
	u = r.send(t, requestQueue, msg, 0)
	require.Zero(t, u.Len)
	// Too large: E2BIG, and the device does not copy it.
	big, unique := r.encode(opWrite, f, &writeIn{Fh: fh, Size: maxMessage}, make([]byte, maxMessage))
	u = r.send(t, requestQueue, big, 64)
	require.True(t, isErrorHeader(u.Data, unique, syscall.E2BIG))
	got, _ = os.ReadFile(filepath.Join(dir, "f"))
	require.Len(t, got, len(content))
}
