package balloon

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

const (
	testMemSize = 16 << 20
	testTimeout = 5 * time.Second
	// firstFreePFN and up are never handed out by the test driver's
	// allocator in these tests (it allocates from the bottom).
	firstFreePFN = 3000
	poison       = 0xAA
)

var errUnaligned = errors.New("discard not page-aligned")

// discardCall is one Discard the device made.
type discardCall struct{ gpa, length uint64 }

// recordingMemory is a SliceMemory that records every Discard (and then
// does it, unless keep is set).
type recordingMemory struct {
	*virtio.SliceMemory
	keep bool // record only, leave the bytes (fuzzing: rings survive)
	// onePage refuses discards of more than a page, as the VMM's memory
	// refuses a range spanning two RAM regions.
	onePage bool

	mu    sync.Mutex
	calls []discardCall
}

func (m *recordingMemory) Discard(gpa, length uint64) (uint64, error) {
	m.mu.Lock()
	m.calls = append(m.calls, discardCall{gpa, length})
	m.mu.Unlock()
	if m.onePage && length > virtio.PageSize {
		return 0, errors.New("range spans two regions")
	}
	if m.keep {
		if gpa%virtio.PageSize != 0 || length%virtio.PageSize != 0 {
			return 0, errUnaligned
		}
		return length, m.CheckRange(gpa, length)
	}
	return m.SliceMemory.Discard(gpa, length)
}

func (m *recordingMemory) discards() []discardCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]discardCall(nil), m.calls...)
}

// plainMemory hides SliceMemory's Discarder (and everything but the
// GuestMemory and RangeChecker methods).
type plainMemory struct{ m *virtio.SliceMemory }

func (p plainMemory) ReadAt(b []byte, gpa uint64) error  { return p.m.ReadAt(b, gpa) }
func (p plainMemory) WriteAt(b []byte, gpa uint64) error { return p.m.WriteAt(b, gpa) }
func (p plainMemory) CheckRange(gpa, n uint64) error     { return p.m.CheckRange(gpa, n) }

type rig struct {
	dev *Device
	d   *virtiotest.Driver
	mem *recordingMemory
}

type rigOptions struct {
	opts     Options
	refuse   uint64 // features the driver declines
	plain    bool   // memory without Discarder
	keep     bool   // record discards without zeroing
	memSize  int    // 0: testMemSize
	beforeOK func(d *virtiotest.Driver)
}

// newRig makes a device over a 16 MiB recording memory and initialises a
// driver the way Linux does, refusing the given features.
func newRig(t testing.TB, ro rigOptions) *rig {
	t.Helper()
	if ro.memSize == 0 {
		ro.memSize = testMemSize
	}
	if ro.opts.RAMBytes == 0 {
		ro.opts.RAMBytes = uint64(ro.memSize)
	}
	if ro.opts.Logger == nil {
		ro.opts.Logger = slog.New(slog.DiscardHandler)
	}
	dev, err := New(ro.opts)
	require.NoError(t, err)
	slice := virtio.NewSliceMemory(ro.memSize)
	mem := &recordingMemory{SliceMemory: slice, keep: ro.keep}
	var guest virtio.GuestMemory = mem
	if ro.plain {
		guest = plainMemory{slice}
	}
	irq := virtiotest.NewIRQ()
	mmio := virtio.NewMMIO(dev, guest, irq, virtio.MMIOOptions{Logger: slog.New(slog.DiscardHandler)})
	d := virtiotest.NewDriver(mmio, slice, irq)
	t.Cleanup(d.Reset)
	require.NoError(t, initDriver(d, ro.refuse, ro.beforeOK))
	return &rig{dev: dev, d: d, mem: mem}
}

// initDriver is virtiotest's Init with a hook before DRIVER_OK (Linux
// posts its statistics buffer there).
func initDriver(d *virtiotest.Driver, refuse uint64, beforeOK func(*virtiotest.Driver)) error {
	d.Reset()
	d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver)
	if _, err := d.Negotiate(^refuse); err != nil {
		return err
	}
	for i := range slotCount {
		if _, err := d.SetupQueue(i, 0); err != nil {
			return err
		}
	}
	if beforeOK != nil {
		beforeOK(d)
	}
	return d.DriverOK()
}

func pfnBytes(pfns ...uint32) []byte {
	b := make([]byte, 4*len(pfns))
	for i, p := range pfns {
		binary.LittleEndian.PutUint32(b[4*i:], p)
	}
	return b
}

func statsBytes(entries ...[2]uint64) []byte {
	b := make([]byte, statsEntrySize*len(entries))
	for i, e := range entries {
		binary.LittleEndian.PutUint16(b[statsEntrySize*i:], uint16(e[0]))
		binary.LittleEndian.PutUint64(b[statsEntrySize*i+2:], e[1])
	}
	return b
}

// poisonPages fills pages [first, first+count) with the poison byte.
func (r *rig) poisonPages(t *testing.T, first, count uint64) {
	t.Helper()
	require.NoError(t, r.d.Mem.WriteAt(bytes.Repeat([]byte{poison}, int(count*virtio.PageSize)), first*virtio.PageSize))
}

// page reports whether page pfn is all zero ("zero"), all poison
// ("poison") or anything else ("mixed").
func (r *rig) page(t *testing.T, pfn uint64) string {
	t.Helper()
	b := make([]byte, virtio.PageSize)
	require.NoError(t, r.d.Mem.ReadAt(b, pfn*virtio.PageSize))
	switch {
	case bytes.Equal(b, make([]byte, virtio.PageSize)):
		return "zero"
	case bytes.Equal(b, bytes.Repeat([]byte{poison}, virtio.PageSize)):
		return "poison"
	}
	return "mixed"
}

// send adds one readable chain to queue, kicks and waits for it back.
func (r *rig) send(t *testing.T, queue int, data []byte) virtiotest.Used {
	t.Helper()
	q := r.d.Queue(queue)
	head, err := q.Add(virtiotest.Readable(data))
	require.NoError(t, err)
	q.Kick()
	used, err := q.Wait(testTimeout)
	require.NoError(t, err)
	require.Equal(t, head, used.Head)
	require.Zero(t, used.Len)
	return used
}

// sendRaw publishes the given descriptors as one chain (linked in order,
// from entry 0 of the table) on queue, kicks and waits for it back.
func (r *rig) sendRaw(t *testing.T, queue int, descs ...virtiotest.Descriptor) virtiotest.Used {
	t.Helper()
	q := r.d.Queue(queue)
	for i, dsc := range descs {
		if i+1 < len(descs) {
			dsc.Flags |= virtio.DescFlagNext
			dsc.Next = uint16(i + 1)
		}
		require.NoError(t, q.WriteDescriptor(uint16(i), dsc))
	}
	require.NoError(t, q.PublishHead(0))
	q.Kick()
	used, err := q.Wait(testTimeout)
	require.NoError(t, err)
	require.Zero(t, used.Head)
	require.Zero(t, used.Len)
	return used
}

// writable is a device-writable descriptor of count pages at pfn.
func writable(pfn, count uint64) virtiotest.Descriptor {
	return virtiotest.Descriptor{Addr: pfn * virtio.PageSize, Len: uint32(count * virtio.PageSize), Flags: virtio.DescFlagWrite}
}

// eventually polls cond until it holds or the test times out.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(time.Millisecond)
	}
}
