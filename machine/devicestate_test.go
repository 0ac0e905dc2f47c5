package machine

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// statefulDevice is a one-queue device keeping a state of its own
// (virtio.StateSaver); it records the calls it gets, in order.
type statefulDevice struct {
	mu      sync.Mutex
	state   []byte
	calls   []string
	failing error // RestoreDeviceState's error
}

func (d *statefulDevice) Type() uint32               { return 0x7e }
func (d *statefulDevice) Features() uint64           { return 0 }
func (d *statefulDevice) QueueMaxSizes() []uint16    { return []uint16{16} }
func (d *statefulDevice) ReadConfig(uint64, []byte)  {}
func (d *statefulDevice) WriteConfig(uint64, []byte) {}
func (d *statefulDevice) Notify(int)                 {}
func (d *statefulDevice) Reset()                     { d.record("reset") }
func (d *statefulDevice) record(call string) {
	d.mu.Lock()
	d.calls = append(d.calls, call)
	d.mu.Unlock()
}
func (d *statefulDevice) recorded() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}
func (d *statefulDevice) SaveDeviceState() ([]byte, error) { d.record("save"); return d.state, nil }

func (d *statefulDevice) Activate(virtio.GuestMemory, virtio.Interrupt, []*virtio.Queue, uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, "activate:"+string(d.state))
	return nil
}

func (d *statefulDevice) RestoreDeviceState(state []byte) error {
	d.record("restore")
	if d.failing != nil {
		return d.failing
	}
	d.mu.Lock()
	d.state = state
	d.mu.Unlock()
	return nil
}

// writeSections writes sections as a snapshot file and opens it.
func writeSections(t *testing.T, sections []snapshot.Section) *snapshot.File {
	t.Helper()
	id := snapshot.Identity{Build: "test"}
	path := filepath.Join(t.TempDir(), "snap")
	w, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, snapshot.Write(w, id, sections))
	require.NoError(t, w.Close())
	f, err := snapshot.Open(path, id)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// A device's own state is saved after its transport is quiet and given
// back to a fresh device before its transport activates it; a snapshot
// with no such state (taken before devices saved theirs) restores into a
// device that starts afresh.
func TestDeviceStateSavedAndRestoredBeforeActivation(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	old := &statefulDevice{state: []byte("session")}
	d := virtiotest.Start(t, old, virtiotest.Options{})
	sections, err := transportSections([]*virtio.MMIO{d.MMIO()})
	require.NoError(t, err)
	require.Equal(t, []string{"activate:session", "save"}, old.recorded()[1:], "after the driver's reset")
	names := []string{sections[0].Name, sections[1].Name}
	require.Equal(t, []string{"machine/virtio/0", "machine/virtio-dev/0"}, names)
	f := writeSections(t, sections)

	fresh := &statefulDevice{}
	transport := virtio.NewMMIO(fresh, d.Mem, d.IRQ, virtio.MMIOOptions{Logger: quiet})
	require.NoError(t, restoreTransports(f, []*virtio.MMIO{transport}))
	require.Equal(t, []string{"restore", "activate:session"}, fresh.recorded())

	// Before this change: only the transport's section.
	sections, err = transportSections([]*virtio.MMIO{d.MMIO()})
	require.NoError(t, err)
	f = writeSections(t, sections[:1])
	older := &statefulDevice{}
	transport = virtio.NewMMIO(older, d.Mem, d.IRQ, virtio.MMIOOptions{Logger: quiet})
	require.NoError(t, restoreTransports(f, []*virtio.MMIO{transport}))
	require.Equal(t, []string{"activate:"}, older.recorded())
}

// A device that refuses its state fails the restore before its transport
// activates it, with the device named.
func TestDeviceStateRefusedFailsTheRestore(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	d := virtiotest.Start(t, &statefulDevice{state: []byte("s")}, virtiotest.Options{})
	sections, err := transportSections([]*virtio.MMIO{d.MMIO()})
	require.NoError(t, err)
	f := writeSections(t, sections)
	refusing := &statefulDevice{failing: errors.New("export e1 is gone")}
	transport := virtio.NewMMIO(refusing, d.Mem, d.IRQ, virtio.MMIOOptions{Logger: quiet})
	err = restoreTransports(f, []*virtio.MMIO{transport})
	require.ErrorContains(t, err, "virtio device 0")
	require.ErrorContains(t, err, "export e1 is gone")
	require.Equal(t, []string{"restore"}, refusing.recorded())
	require.Zero(t, transport.Status())
}

// Caller sections may not take the machine's or the VM's names.
func TestExtraSectionNames(t *testing.T) {
	require.NoError(t, checkExtraSections([]snapshot.Section{{Name: "backend/exports"}}))
	for _, bad := range [][]snapshot.Section{
		{{Name: ""}}, {{Name: "machine/uart"}}, {{Name: "vm"}}, {{Name: "memory"}},
		{{Name: "backend/x"}, {Name: "backend/x"}},
	} {
		require.Error(t, checkExtraSections(bad), "%+v", bad)
	}
}
