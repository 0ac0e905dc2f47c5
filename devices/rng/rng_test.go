package rng

import (
	"bytes"
	"errors"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

func TestFillsWritableBuffers(t *testing.T) {
	d := virtiotest.Start(t, New(nil), virtiotest.Options{})
	q := d.Queue(0)
	head, err := q.Add(virtiotest.Writable(64), virtiotest.Writable(100))
	require.NoError(t, err)
	q.Kick()
	used, err := q.Wait(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, head, used.Head)
	require.EqualValues(t, 164, used.Len)
	require.Len(t, used.Data, 164)
	require.False(t, bytes.Equal(used.Data[:32], make([]byte, 32)), "entropy is all zeros")
	require.NotZero(t, d.IRQ.Count(), "no used-buffer interrupt")
}

func TestIndirectAndManyRequests(t *testing.T) {
	d := virtiotest.Start(t, New(nil), virtiotest.Options{QueueSizes: []uint16{8}})
	q := d.Queue(0)
	for round := range 10 {
		for range 8 {
			_, err := q.AddIndirect(virtiotest.Writable(16), virtiotest.Writable(16))
			require.NoError(t, err)
		}
		q.Kick()
		used, err := q.WaitN(8, 5*time.Second)
		require.NoError(t, err, "round %d", round)
		for _, u := range used {
			require.EqualValues(t, 32, u.Len)
		}
	}
}

func TestCapsHugeRequests(t *testing.T) {
	d := virtiotest.Start(t, New(nil), virtiotest.Options{MemSize: 8 << 20})
	q := d.Queue(0)
	_, err := q.Add(virtiotest.Writable(1 << 20))
	require.NoError(t, err)
	q.Kick()
	used, err := q.Wait(5 * time.Second)
	require.NoError(t, err)
	require.EqualValues(t, MaxBytesPerRequest, used.Len)
}

func TestReadableOnlyChainGetsNothing(t *testing.T) {
	d := virtiotest.Start(t, New(nil), virtiotest.Options{})
	q := d.Queue(0)
	_, err := q.Add(virtiotest.Readable([]byte("not a request")))
	require.NoError(t, err)
	q.Kick()
	used, err := q.Wait(5 * time.Second)
	require.NoError(t, err)
	require.Zero(t, used.Len)
}

func TestBrokenQueueNeedsReset(t *testing.T) {
	d := virtiotest.Start(t, New(nil), virtiotest.Options{QueueSizes: []uint16{4}})
	q := d.Queue(0)
	require.NoError(t, q.SetAvailIdx(100)) // 100 entries ahead of a 4-entry queue
	q.Kick()
	deadline := time.Now().Add(5 * time.Second)
	for d.Status()&virtio.StatusDeviceNeedsReset == 0 {
		require.True(t, time.Now().Before(deadline), "device never set DEVICE_NEEDS_RESET")
		time.Sleep(time.Millisecond)
	}
	require.NotZero(t, d.ReadReg(virtio.MMIOInterruptStatus)&virtio.InterruptConfigChange)
	// A reset and a fresh set-up bring the device back. Fresh RAM for the
	// rebooted guest's rings: the driver may place them where the broken
	// ones were, whose avail index would break the new queue at once.
	d.Reset()
	require.NoError(t, d.Mem.WriteAt(make([]byte, d.Mem.Size()), 0))
	require.NoError(t, d.Init())
	q = d.Queue(0)
	_, err := q.Add(virtiotest.Writable(8))
	require.NoError(t, err)
	q.Kick()
	used, err := q.Wait(5 * time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 8, used.Len)
}

func TestEntropyFailuresAreLoggedRateLimited(t *testing.T) {
	logs := &ratelogtest.LogBuffer{}
	dev := New(logs.Logger())
	dev.source = iotest.ErrReader(errors.New("no entropy"))
	d := virtiotest.Start(t, dev, virtiotest.Options{})
	q := d.Queue(0)
	for range 3 * ratelog.DefaultBurst {
		_, err := q.Add(virtiotest.Writable(16))
		require.NoError(t, err)
		q.Kick()
		_, err = q.Wait(5 * time.Second)
		require.NoError(t, err)
	}
	lines := logs.Lines("virtio-rng: reading host entropy failed")
	require.Len(t, lines, ratelog.DefaultBurst, logs.String())
	require.Contains(t, lines[0], "device=virtio-rng")
}
