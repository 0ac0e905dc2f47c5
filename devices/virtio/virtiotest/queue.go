package virtiotest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// Buffer is one buffer of a chain the driver adds: a readable buffer
// carries Data to the device; a writable one offers Len bytes (or
// len(Data) when Len is 0) for the device to fill.
type Buffer struct {
	Data     []byte
	Len      uint32
	Writable bool
}

// Readable returns a device-readable buffer holding a copy of p.
func Readable(p []byte) Buffer { return Buffer{Data: append([]byte(nil), p...)} }

// Writable returns a device-writable buffer of n bytes.
func Writable(n uint32) Buffer { return Buffer{Len: n, Writable: true} }

func (b Buffer) size() uint32 {
	if b.Writable && b.Len != 0 {
		return b.Len
	}
	return uint32(len(b.Data))
}

// Used is one element the device put in the used ring.
type Used struct {
	Head uint16 // chain head the device returned
	Len  uint32 // bytes the device says it wrote
	// Data is the first min(Len, writable size) bytes of the chain's
	// writable buffers, concatenated; nil for a head this driver did not
	// add through Add or AddIndirect.
	Data []byte
}

// inflight remembers what a chain added through Add owns.
type inflight struct {
	descs    []uint16 // descriptor-table entries to free
	allocs   []span   // guest memory to release
	writable []span   // the writable buffers, in order
}

// ErrTimeout is returned by Wait when nothing arrives in time.
var ErrTimeout = errors.New("virtiotest: timed out waiting for the used ring")

// DriverQueue is the driver side of one split virtqueue. Safe for
// concurrent use.
type DriverQueue struct {
	d      *Driver
	index  int
	layout virtio.QueueLayout

	mu        sync.Mutex
	freeDescs []uint16
	availIdx  uint16 // shadow of the available index
	usedSeen  uint16 // next used element to collect
	pending   map[uint16]*inflight
}

func newDriverQueue(d *Driver, index int, layout virtio.QueueLayout) *DriverQueue {
	q := &DriverQueue{d: d, index: index, layout: layout, pending: map[uint16]*inflight{}}
	for i := int(layout.Size) - 1; i >= 0; i-- {
		q.freeDescs = append(q.freeDescs, uint16(i))
	}
	return q
}

// releaseAll returns the rings and every in-flight buffer to the
// allocator; the queue is unusable afterwards.
func (q *DriverQueue) releaseAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, in := range q.pending {
		q.releaseSpans(in.allocs)
	}
	q.pending = map[uint16]*inflight{}
	q.freeDescs = nil
	l := q.layout
	q.releaseSpans([]span{
		{l.DescTable, virtio.DescriptorSize * uint64(l.Size)},
		{l.AvailRing, 6 + 2*uint64(l.Size)},
		{l.UsedRing, 6 + 8*uint64(l.Size)},
	})
}

// Index is the queue's index on the device.
func (q *DriverQueue) Index() int { return q.index }

// Layout is where the queue's rings live in guest memory.
func (q *DriverQueue) Layout() virtio.QueueLayout { return q.layout }

// FreeDescriptors is how many descriptor-table entries are unused.
func (q *DriverQueue) FreeDescriptors() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.freeDescs)
}

// InFlight is how many chains added through Add are not yet collected.
func (q *DriverQueue) InFlight() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}

// Add copies bufs into freshly allocated guest memory, links them as one
// chain of direct descriptors (in the given order; put readable before
// writable unless testing the device's refusal) and makes it available.
// It does not kick. It returns the chain's head.
func (q *DriverQueue) Add(bufs ...Buffer) (uint16, error) {
	if len(bufs) == 0 {
		return 0, errors.New("virtiotest: a chain needs at least one buffer")
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(bufs) > len(q.freeDescs) {
		return 0, fmt.Errorf("virtiotest: queue %d has %d free descriptors, chain needs %d", q.index, len(q.freeDescs), len(bufs))
	}
	in, descs, err := q.placeBuffers(bufs)
	if err != nil {
		return 0, err
	}
	ids := q.takeDescs(len(descs))
	for i := range descs {
		if i+1 < len(descs) {
			descs[i].Flags |= virtio.DescFlagNext
			descs[i].Next = ids[i+1]
		}
		if err := q.writeDescriptor(q.layout.DescTable, ids[i], descs[i]); err != nil {
			return 0, err
		}
	}
	in.descs = ids
	return ids[0], q.publish(ids[0], in)
}

// AddIndirect is Add with the buffers in an indirect descriptor table
// referenced by a single descriptor of the ring (VIRTIO_F_INDIRECT_DESC).
func (q *DriverQueue) AddIndirect(bufs ...Buffer) (uint16, error) {
	if len(bufs) == 0 {
		return 0, errors.New("virtiotest: a chain needs at least one buffer")
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.freeDescs) == 0 {
		return 0, fmt.Errorf("virtiotest: queue %d has no free descriptor", q.index)
	}
	in, descs, err := q.placeBuffers(bufs)
	if err != nil {
		return 0, err
	}
	tableSize := uint64(virtio.DescriptorSize * len(descs))
	table, err := q.d.Alloc(tableSize, 16)
	if err != nil {
		q.releaseSpans(in.allocs)
		return 0, err
	}
	in.allocs = append(in.allocs, span{table, tableSize})
	for i := range descs {
		if i+1 < len(descs) {
			descs[i].Flags |= virtio.DescFlagNext
			descs[i].Next = uint16(i + 1)
		}
		if err := q.writeDescriptor(table, uint16(i), descs[i]); err != nil {
			return 0, err
		}
	}
	ids := q.takeDescs(1)
	in.descs = ids
	err = q.writeDescriptor(q.layout.DescTable, ids[0], Descriptor{Addr: table, Len: uint32(tableSize), Flags: virtio.DescFlagIndirect})
	if err != nil {
		return 0, err
	}
	return ids[0], q.publish(ids[0], in)
}

// placeBuffers allocates and fills guest memory for bufs.
func (q *DriverQueue) placeBuffers(bufs []Buffer) (*inflight, []Descriptor, error) {
	in := &inflight{}
	descs := make([]Descriptor, 0, len(bufs))
	for _, b := range bufs {
		size := b.size()
		addr, err := q.d.Alloc(uint64(max(size, 1)), 8)
		if err != nil {
			q.releaseSpans(in.allocs)
			return nil, nil, err
		}
		in.allocs = append(in.allocs, span{addr, uint64(max(size, 1))})
		d := Descriptor{Addr: addr, Len: size}
		if b.Writable {
			d.Flags = virtio.DescFlagWrite
			in.writable = append(in.writable, span{addr, uint64(size)})
			// Poison, so a test sees bytes the device did not write.
			if err := q.d.Mem.WriteAt(make([]byte, size), addr); err != nil {
				return nil, nil, err
			}
		} else if err := q.d.Mem.WriteAt(b.Data, addr); err != nil {
			return nil, nil, err
		}
		descs = append(descs, d)
	}
	return in, descs, nil
}

func (q *DriverQueue) releaseSpans(spans []span) {
	for _, s := range spans {
		q.d.Release(s.addr, s.size)
	}
}

func (q *DriverQueue) takeDescs(n int) []uint16 {
	ids := make([]uint16, n)
	for i := range ids {
		last := len(q.freeDescs) - 1
		ids[i] = q.freeDescs[last]
		q.freeDescs = q.freeDescs[:last]
	}
	return ids
}

// publish puts head in the next available slot, then bumps the index.
func (q *DriverQueue) publish(head uint16, in *inflight) error {
	if in != nil {
		q.pending[head] = in
	}
	slot := uint64(q.availIdx % q.layout.Size)
	if err := q.d.Mem.PutUint16(q.layout.AvailRing+4+2*slot, head); err != nil {
		return err
	}
	q.availIdx++
	return q.d.Mem.PutUint16(q.layout.AvailRing+2, q.availIdx)
}

// Kick notifies the device that the queue has new buffers.
func (q *DriverQueue) Kick() { q.d.Notify(q.index) }

// Poll returns the next used element, if the device produced one, and
// frees what the chain held.
func (q *DriverQueue) Poll() (Used, bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	usedIdx, err := q.d.Mem.Uint16(q.layout.UsedRing + 2)
	if err != nil {
		return Used{}, false, err
	}
	if usedIdx == q.usedSeen {
		// Ask for an interrupt at the next one (EVENT_IDX's used_event).
		err := q.d.Mem.PutUint16(q.layout.AvailRing+4+2*uint64(q.layout.Size), q.usedSeen)
		return Used{}, false, err
	}
	if pending := usedIdx - q.usedSeen; pending > q.layout.Size {
		return Used{}, false, fmt.Errorf("virtiotest: device's used index %d ran %d ahead (queue size %d)", usedIdx, pending, q.layout.Size)
	}
	var elem [8]byte
	slot := uint64(q.usedSeen % q.layout.Size)
	if err := q.d.Mem.ReadAt(elem[:], q.layout.UsedRing+4+8*slot); err != nil {
		return Used{}, false, err
	}
	q.usedSeen++
	id := binary.LittleEndian.Uint32(elem[0:])
	u := Used{Head: uint16(id), Len: binary.LittleEndian.Uint32(elem[4:])}
	if id >= uint32(q.layout.Size) {
		return u, true, fmt.Errorf("virtiotest: device returned id %d outside the queue", id)
	}
	if in := q.pending[u.Head]; in != nil {
		delete(q.pending, u.Head)
		u.Data, err = q.collect(in, u.Len)
		q.freeDescs = append(q.freeDescs, in.descs...)
		q.releaseSpans(in.allocs)
	}
	return u, true, err
}

// collect reads up to n bytes the device wrote into the writable buffers.
func (q *DriverQueue) collect(in *inflight, n uint32) ([]byte, error) {
	var room uint64
	for _, w := range in.writable {
		room += w.size
	}
	data := make([]byte, min(uint64(n), room))
	at := data
	for _, w := range in.writable {
		if len(at) == 0 {
			break
		}
		chunk := min(uint64(len(at)), w.size)
		if err := q.d.Mem.ReadAt(at[:chunk], w.addr); err != nil {
			return nil, err
		}
		at = at[chunk:]
	}
	return data, nil
}

// Wait polls until the device returns a used element, sleeping on the
// interrupt line in between (and acknowledging every pending interrupt bit
// when it fires), and fails with ErrTimeout after timeout.
func (q *DriverQueue) Wait(timeout time.Duration) (Used, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		u, ok, err := q.Poll()
		if ok || err != nil {
			return u, err
		}
		select {
		case <-q.d.IRQ.C():
			q.d.AckInterrupts()
		case <-tick.C:
		case <-deadline.C:
			return Used{}, fmt.Errorf("%w (queue %d, %v)", ErrTimeout, q.index, timeout)
		}
	}
}

// WaitN waits for n used elements, in the order the device returned them.
func (q *DriverQueue) WaitN(n int, timeout time.Duration) ([]Used, error) {
	deadline := time.Now().Add(timeout)
	var out []Used
	for len(out) < n {
		u, err := q.Wait(max(time.Until(deadline), 0))
		if err != nil {
			return out, err
		}
		out = append(out, u)
	}
	return out, nil
}

// Descriptor is a raw descriptor as a hostile test writes it.
type Descriptor struct {
	Addr  uint64
	Len   uint32
	Flags uint16
	Next  uint16
}

func (q *DriverQueue) writeDescriptor(table uint64, index uint16, d Descriptor) error {
	var b [virtio.DescriptorSize]byte
	binary.LittleEndian.PutUint64(b[0:], d.Addr)
	binary.LittleEndian.PutUint32(b[8:], d.Len)
	binary.LittleEndian.PutUint16(b[12:], d.Flags)
	binary.LittleEndian.PutUint16(b[14:], d.Next)
	return q.d.Mem.WriteAt(b[:], table+virtio.DescriptorSize*uint64(index))
}

// WriteDescriptor writes entry index of the descriptor table verbatim. A
// test using it owns the entries it writes: do not mix it with Add on the
// same queue unless the indices are known free.
func (q *DriverQueue) WriteDescriptor(index uint16, d Descriptor) error {
	return q.writeDescriptor(q.layout.DescTable, index, d)
}

// WriteTable writes descriptors verbatim at table (e.g. an indirect table
// allocated with Driver.Alloc).
func (q *DriverQueue) WriteTable(table uint64, descs []Descriptor) error {
	for i, d := range descs {
		if err := q.writeDescriptor(table, uint16(i), d); err != nil {
			return err
		}
	}
	return nil
}

// PublishHead makes head available as is, whatever the table holds.
func (q *DriverQueue) PublishHead(head uint16) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.publish(head, nil)
}

// SetAvailIdx overwrites the available index (hostile tests).
func (q *DriverQueue) SetAvailIdx(idx uint16) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.availIdx = idx
	return q.d.Mem.PutUint16(q.layout.AvailRing+2, idx)
}

// SetAvailFlags writes the available ring's flags
// (virtio.AvailFlagNoInterrupt).
func (q *DriverQueue) SetAvailFlags(flags uint16) error {
	return q.d.Mem.PutUint16(q.layout.AvailRing, flags)
}

// UsedIdx reads the device's used index.
func (q *DriverQueue) UsedIdx() (uint16, error) {
	return q.d.Mem.Uint16(q.layout.UsedRing + 2)
}
