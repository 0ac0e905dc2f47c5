package vsock_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
)

const eventQueue = 2

// restoreVsock saves the device behind drv, resets it (the VM is gone)
// and activates a fresh device through a fresh transport over the same
// guest memory, given the saved state when withState (a snapshot taken
// before devices saved theirs has none).
func restoreVsock(t *testing.T, old *vsock.Device, drv *virtiotest.Driver, withState bool) *vsock.Device {
	t.Helper()
	state, err := old.SaveDeviceState()
	require.NoError(t, err)
	current := drv.Regs.(*virtio.MMIO) // the last restore's, not drv.MMIO()
	mmio, err := current.SaveState()
	require.NoError(t, err)
	require.NotZero(t, mmio.Status&virtio.StatusDriverOK, "an active device")
	current.Reset()
	fresh := newDevice(t, vsock.Config{})
	if withState {
		require.NoError(t, fresh.RestoreDeviceState(state))
	}
	quiet := slog.New(slog.DiscardHandler)
	transport := virtio.NewMMIO(fresh, drv.Mem, drv.IRQ, virtio.MMIOOptions{Logger: quiet})
	require.NoError(t, transport.RestoreState(mmio))
	drv.Regs = transport
	return fresh
}

// openConnection has the guest (drv's raw rings) open a connection to a
// host listener: a REQUEST on the tx queue, completed by the device.
func openConnection(t *testing.T, dev *vsock.Device, drv *virtiotest.Driver) {
	t.Helper()
	l, err := dev.Listen(1024)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	req := vsock.Header{SrcCID: testCID, DstCID: vsock.HostCID, SrcPort: 5000, DstPort: 1024,
		Type: vsock.TypeStream, Op: vsock.OpRequest, BufAlloc: 4096}
	tx := drv.Queue(1)
	_, err = tx.Add(virtiotest.Readable(req.Bytes()))
	require.NoError(t, err)
	tx.Kick()
	_, err = tx.Wait(waitLimit)
	require.NoError(t, err)
}

// noEvent fails the test if the device fills an event buffer.
func noEvent(t *testing.T, drv *virtiotest.Driver, why string) {
	t.Helper()
	_, err := drv.Queue(eventQueue).Wait(200 * time.Millisecond)
	require.ErrorIs(t, err, virtiotest.ErrTimeout, why)
}

// A restored device tells the guest its transport was reset
// (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET, id 0) in the first event buffer
// the guest posted, once; a device activated afresh, or restored from a
// snapshot without its state, sends nothing.
func TestRestoredDeviceResetsTheGuestTransport(t *testing.T) {
	old := newDevice(t, vsock.Config{})
	drv := virtiotest.Start(t, old, virtiotest.Options{})
	events := drv.Queue(eventQueue)
	_, err := events.Add(virtiotest.Writable(4))
	require.NoError(t, err)
	events.Kick()
	noEvent(t, drv, "a first activation")
	openConnection(t, old, drv)

	restoreVsock(t, old, drv, true)
	u, err := events.Wait(waitLimit)
	require.NoError(t, err)
	require.EqualValues(t, 4, u.Len)
	require.Equal(t, []byte{0, 0, 0, 0}, u.Data)
	_, err = events.Add(virtiotest.Writable(4))
	require.NoError(t, err)
	events.Kick()
	noEvent(t, drv, "one event per restore")
}

// The event waits for the guest's first event buffer when it had posted
// none; a snapshot without the device's state, or taken with no
// connection open, sends none.
func TestTransportResetWaitsForAnEventBuffer(t *testing.T) {
	old := newDevice(t, vsock.Config{})
	drv := virtiotest.Start(t, old, virtiotest.Options{})
	openConnection(t, old, drv)
	restored := restoreVsock(t, old, drv, true)
	events := drv.Queue(eventQueue)
	_, err := events.Add(virtiotest.Writable(8))
	require.NoError(t, err)
	events.Kick()
	u, err := events.Wait(waitLimit)
	require.NoError(t, err)
	require.EqualValues(t, 4, u.Len)

	openConnection(t, restored, drv)
	restored = restoreVsock(t, restored, drv, false)
	_, err = events.Add(virtiotest.Writable(4))
	require.NoError(t, err)
	events.Kick()
	noEvent(t, drv, "a restore without the device's state")

	restoreVsock(t, restored, drv, true)
	noEvent(t, drv, "a snapshot with no connection open")

	for _, bad := range []string{"", "{", `{"Version":2}`, `{"Version":1,"X":1}`} {
		require.Error(t, newDevice(t, vsock.Config{}).RestoreDeviceState([]byte(bad)), bad)
	}
}
