package blk

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// The device keeps no state of its own: a quiet transport's state,
// restored over the same guest memory into a fresh device on the same
// image, goes on where the old one stopped (what machine.Snapshot does).
func TestSnapshotRestore(t *testing.T) {
	f := newImage(t, testImageSize)
	old := newDevice(t, f, Options{})
	g := startGuest(t, old, virtiotest.Options{QueueSizes: []uint16{8}})
	data := pattern(4096, 3)
	for range 5 { // move the ring positions off zero
		status, _ := g.write(2, data, 4096)
		require.Equal(t, int(statusOK), status)
	}
	state, err := g.drv.MMIO().SaveState()
	require.NoError(t, err)
	old.Reset()

	fresh := newDevice(t, f, Options{})
	m := virtio.NewMMIO(fresh, g.drv.Mem, g.drv.IRQ, virtio.MMIOOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, m.RestoreState(state))
	g.drv.Regs = m
	status, got, _ := g.read(2, 4096)
	require.Equal(t, int(statusOK), status)
	require.Equal(t, data, got)
	g.requireServing()
}
