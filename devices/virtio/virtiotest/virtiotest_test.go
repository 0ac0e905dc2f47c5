package virtiotest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

func TestAllocatorAlignsSplitsAndCoalesces(t *testing.T) {
	a := newAllocator(0x1000, 0x2000)
	x, err := a.alloc(10, 16)
	require.NoError(t, err)
	require.EqualValues(t, 0x1000, x)
	y, err := a.alloc(8, 256)
	require.NoError(t, err)
	require.EqualValues(t, 0x1100, y)
	_, err = a.alloc(0x1000, 1)
	require.Error(t, err, "only 0x1000 minus what is used remains")
	a.release(x, 10)
	a.release(y, 8)
	require.Equal(t, []span{{0x1000, 0x1000}}, a.free, "everything coalesced back")
	z, err := a.alloc(0x1000, 1)
	require.NoError(t, err)
	require.EqualValues(t, 0x1000, z)
}

// echoDevice completes each chain with its readable bytes copied into its
// writable buffers, synchronously on Notify.
type echoDevice struct {
	queues []*virtio.Queue
	irq    virtio.Interrupt
}

func (e *echoDevice) Type() uint32               { return 0x43 }
func (e *echoDevice) Features() uint64           { return 0 }
func (e *echoDevice) QueueMaxSizes() []uint16    { return []uint16{8} }
func (e *echoDevice) ReadConfig(uint64, []byte)  {}
func (e *echoDevice) WriteConfig(uint64, []byte) {}
func (e *echoDevice) Reset()                     { e.queues = nil }
func (e *echoDevice) Activate(_ virtio.GuestMemory, irq virtio.Interrupt, q []*virtio.Queue, _ uint64) error {
	e.queues, e.irq = q, irq
	return nil
}

func (e *echoDevice) Notify(i int) {
	q := e.queues[i]
	for {
		c, err := q.Pop()
		if err != nil || c == nil {
			return
		}
		buf := make([]byte, c.ReadableLen())
		_, _ = c.Reader().Read(buf)
		_, _ = c.Writer().Write(buf)
		_ = q.Complete(c, c.Writer().Written(), e.irq)
	}
}

func TestDriverEchoRoundTrips(t *testing.T) {
	d := Start(t, &echoDevice{}, Options{MemSize: 1 << 20})
	q := d.Queue(0)
	for round := range 200 { // far more than the memory holds without reuse
		head, err := q.AddIndirect(Readable([]byte("ping")), Writable(2), Writable(8<<10))
		require.NoError(t, err)
		q.Kick()
		used, err := q.Wait(5 * time.Second)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, head, used.Head)
		require.Equal(t, "ping", string(used.Data))
	}
	require.Zero(t, q.InFlight())
	require.Equal(t, 8, q.FreeDescriptors())
	require.NotZero(t, d.IRQ.Count())
}

func TestDriverWaitTimesOut(t *testing.T) {
	d := Start(t, &echoDevice{}, Options{})
	_, err := d.Queue(0).Add(Readable([]byte("x")))
	require.NoError(t, err)
	// No kick: the device never sees it.
	_, err = d.Queue(0).Wait(10 * time.Millisecond)
	require.True(t, errors.Is(err, ErrTimeout))
}

func TestDriverRefusesTooLongChain(t *testing.T) {
	d := Start(t, &echoDevice{}, Options{})
	bufs := make([]Buffer, 9)
	for i := range bufs {
		bufs[i] = Writable(1)
	}
	_, err := d.Queue(0).Add(bufs...)
	require.Error(t, err)
}

func TestDriverResetReleasesMemory(t *testing.T) {
	d := New(&echoDevice{}, Options{MemSize: 64 << 10})
	for range 100 { // each Init allocates rings; Reset must give them back
		require.NoError(t, d.Init())
		_, err := d.Queue(0).Add(Writable(1 << 10))
		require.NoError(t, err)
	}
	d.Reset()
	require.Equal(t, []span{{reservedLow, 64<<10 - reservedLow}}, d.alloc.free)
}
