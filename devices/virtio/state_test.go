package virtio_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/rng"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// A transport's state, restored into a fresh transport of a fresh device
// over the same guest memory, lets the driver go on: the registers read
// as it left them and its next request is served in the next used slot.
func TestMMIOStateRestoresIntoAFreshTransport(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	d := virtiotest.Start(t, rng.New(quiet), virtiotest.Options{})
	q := d.Queue(0)
	for range 3 {
		_, err := q.Add(virtiotest.Writable(32))
		require.NoError(t, err)
		q.Kick()
		u, err := q.Wait(5 * time.Second)
		require.NoError(t, err)
		require.EqualValues(t, 32, u.Len)
	}
	state, err := d.MMIO().SaveState()
	require.NoError(t, err)
	status := d.MMIO().Status()
	d.MMIO().Reset() // the old VM is gone

	fresh := virtio.NewMMIO(rng.New(quiet), d.Mem, d.IRQ, virtio.MMIOOptions{Logger: quiet})
	require.NoError(t, fresh.RestoreState(state))
	d.Regs = fresh
	require.Equal(t, status, d.Status())
	require.EqualValues(t, 1, d.ReadReg(virtio.MMIOQueueReady))
	_, err = q.Add(virtiotest.Writable(48))
	require.NoError(t, err)
	q.Kick()
	u, err := q.Wait(5 * time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 48, u.Len)
	idx, err := q.UsedIdx()
	require.NoError(t, err)
	require.EqualValues(t, 4, idx, "the restored device fills the used slot after the last one")
	require.ErrorContains(t, fresh.RestoreState(state), "never set up")
}

// A queue whose device holds a chain it has not answered cannot be saved,
// and a state restores only into a transport of the same device type.
func TestMMIOStateRefusals(t *testing.T) {
	p := newProbeDevice()
	d := virtiotest.Start(t, p, virtiotest.Options{})
	_, err := d.Queue(0).Add(virtiotest.Writable(8))
	require.NoError(t, err)
	p.mu.Lock()
	queue := p.queues[0]
	p.mu.Unlock()
	chain, err := queue.Pop()
	require.NoError(t, err)
	require.NotNil(t, chain)
	_, err = d.MMIO().SaveState()
	require.ErrorIs(t, err, virtio.ErrInFlight)
	require.NoError(t, queue.Push(chain, 0))
	state, err := d.MMIO().SaveState()
	require.NoError(t, err)

	quiet := slog.New(slog.DiscardHandler)
	other := virtio.NewMMIO(rng.New(quiet), d.Mem, nil, virtio.MMIOOptions{Logger: quiet})
	require.ErrorContains(t, other.RestoreState(state), "device type")
	fewer := virtio.NewMMIO(newProbeDevice(16, 16), d.Mem, nil, virtio.MMIOOptions{Logger: quiet})
	require.ErrorContains(t, fewer.RestoreState(state), "queues")
	broken := state
	broken.Queues = []virtio.MMIOQueueState{{Ready: true, Layout: virtio.QueueLayout{Size: 3}}}
	require.Error(t, virtio.NewMMIO(newProbeDevice(), d.Mem, nil, virtio.MMIOOptions{Logger: quiet}).RestoreState(broken))
}
