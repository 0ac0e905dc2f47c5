package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// ErrQueueBroken is wrapped by every error that leaves a queue unusable
// until the device is reset: the driver's available index ran ahead by more
// than the queue size, or a ring lies outside guest memory. The device
// passes such an error to Interrupt.NeedsReset.
var ErrQueueBroken = errors.New("virtio: queue broken, device needs reset")

// ErrAlreadyPushed is returned by Push for a chain given back twice.
var ErrAlreadyPushed = errors.New("virtio: chain already returned to the used ring")

// ErrInvalidLayout wraps every reason NewQueue refuses a layout.
var ErrInvalidLayout = errors.New("virtio: invalid queue layout")

// QueueLayout is where the driver placed a split virtqueue: its size and
// the guest physical addresses of the descriptor table, the available ring
// (driver area) and the used ring (device area).
type QueueLayout struct {
	Size      uint16
	DescTable uint64
	AvailRing uint64
	UsedRing  uint64
}

// Sizes of the three areas in bytes, including the event-index fields.
func (l QueueLayout) descBytes() uint64  { return DescriptorSize * uint64(l.Size) }
func (l QueueLayout) availBytes() uint64 { return 4 + 2*uint64(l.Size) + 2 }
func (l QueueLayout) usedBytes() uint64  { return 4 + 8*uint64(l.Size) + 2 }

// Validate checks the layout's shape: size a power of two in [1, maxSize]
// (maxSize ≤ MaxQueueSize), areas aligned as the spec requires (16, 2, 4)
// and not wrapping around the address space.
func (l QueueLayout) Validate(maxSize uint16) error {
	if maxSize > MaxQueueSize {
		maxSize = MaxQueueSize
	}
	switch {
	case l.Size == 0 || l.Size&(l.Size-1) != 0:
		return fmt.Errorf("%w: size %d is not a power of two", ErrInvalidLayout, l.Size)
	case l.Size > maxSize:
		return fmt.Errorf("%w: size %d exceeds the maximum %d", ErrInvalidLayout, l.Size, maxSize)
	case l.DescTable%16 != 0:
		return fmt.Errorf("%w: descriptor table %#x not 16-byte aligned", ErrInvalidLayout, l.DescTable)
	case l.AvailRing%2 != 0:
		return fmt.Errorf("%w: available ring %#x not 2-byte aligned", ErrInvalidLayout, l.AvailRing)
	case l.UsedRing%4 != 0:
		return fmt.Errorf("%w: used ring %#x not 4-byte aligned", ErrInvalidLayout, l.UsedRing)
	}
	for _, a := range []struct {
		name       string
		addr, size uint64
	}{{"descriptor table", l.DescTable, l.descBytes()}, {"available ring", l.AvailRing, l.availBytes()}, {"used ring", l.UsedRing, l.usedBytes()}} {
		if a.addr > math.MaxUint64-a.size {
			return fmt.Errorf("%w: %s at %#x wraps the address space", ErrInvalidLayout, a.name, a.addr)
		}
	}
	return nil
}

// Queue is the device side of one split virtqueue (virtio 1.2 §2.7). It is
// safe for concurrent use: one goroutine may Pop while others Push.
type Queue struct {
	mem      GuestMemory
	layout   QueueLayout
	indirect bool // VIRTIO_F_INDIRECT_DESC negotiated
	eventIdx bool // VIRTIO_F_EVENT_IDX negotiated

	maxChainBytes atomic.Uint64 // 0: MaxChainBytes; see SetMaxChainBytes

	mu            sync.Mutex
	nextAvail     uint16 // next available-ring slot to consume
	nextUsed      uint16 // next used-ring slot to fill
	signalledUsed uint16 // nextUsed when NeedsInterrupt last decided
	broken        error
	barrier       atomic.Uint32
	scratch       []byte   // copy of an indirect table
	small         [16]byte // for ring fields and descriptors, under mu
}

// NewQueue makes a queue over the driver's rings. features is the
// negotiated feature set (only FeatureIndirectDesc and FeatureEventIdx
// matter here). The layout must pass Validate and its three areas must lie
// in guest memory.
func NewQueue(mem GuestMemory, layout QueueLayout, features uint64) (*Queue, error) {
	if err := layout.Validate(MaxQueueSize); err != nil {
		return nil, err
	}
	for _, a := range []struct {
		name       string
		addr, size uint64
	}{{"descriptor table", layout.DescTable, layout.descBytes()}, {"available ring", layout.AvailRing, layout.availBytes()}, {"used ring", layout.UsedRing, layout.usedBytes()}} {
		if err := checkRange(mem, a.addr, a.size); err != nil {
			return nil, fmt.Errorf("%w: %s [%#x, +%#x) not in guest memory: %w", ErrInvalidLayout, a.name, a.addr, a.size, err)
		}
	}
	return &Queue{
		mem:      mem,
		layout:   layout,
		indirect: features&FeatureIndirectDesc != 0,
		eventIdx: features&FeatureEventIdx != 0,
	}, nil
}

// checkRange refuses [addr, addr+size) unless it is in guest memory, using
// the memory's RangeChecker or, failing that, probing both ends.
func checkRange(mem GuestMemory, addr, size uint64) error {
	if size == 0 {
		return nil
	}
	if addr > math.MaxUint64-size {
		return fmt.Errorf("[%#x, +%#x) wraps the address space", addr, size)
	}
	if rc, ok := mem.(RangeChecker); ok {
		return rc.CheckRange(addr, size)
	}
	var probe [1]byte
	if err := mem.ReadAt(probe[:], addr); err != nil {
		return err
	}
	return mem.ReadAt(probe[:], addr+size-1)
}

// SetMaxChainBytes raises (or lowers) the cap on one chain's total buffer
// length for this queue, from the default MaxChainBytes, clamped to
// math.MaxUint32 (chain lengths are 32-bit). For a device that never
// touches the bytes behind its buffers, only their addresses: the
// balloon's free page reports name up to 32 blocks of 4 MiB (128 MiB).
// Chains popped afterwards obey the new cap; 0 restores the default.
func (q *Queue) SetMaxChainBytes(n uint64) {
	q.maxChainBytes.Store(min(n, math.MaxUint32))
}

func (q *Queue) chainByteLimit() uint64 {
	if n := q.maxChainBytes.Load(); n != 0 {
		return n
	}
	return MaxChainBytes
}

// Layout returns where the queue lives.
func (q *Queue) Layout() QueueLayout { return q.layout }

// Size returns the number of descriptors.
func (q *Queue) Size() uint16 { return q.layout.Size }

// fence is a full memory barrier (an atomic read-modify-write), ordering our
// stores to the used ring before our later loads of the driver's fields.
func (q *Queue) fence() { q.barrier.Add(1) }

// readUint16 and writeUint16 use q.small (the caller holds q.mu), so
// that no access allocates.
func (q *Queue) readUint16(gpa uint64) (uint16, error) {
	b := q.small[:2]
	if err := q.mem.ReadAt(b, gpa); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b), nil
}

func (q *Queue) writeUint16(gpa uint64, v uint16) error {
	b := q.small[:2]
	binary.LittleEndian.PutUint16(b, v)
	return q.mem.WriteAt(b, gpa)
}

func (q *Queue) fail(format string, args ...any) error {
	q.broken = fmt.Errorf("%w: "+format, append([]any{ErrQueueBroken}, args...)...)
	return q.broken
}

// pendingLocked reads the driver's available index and returns how many
// entries wait, checking that it ran at most a queue's worth ahead of what
// we consumed.
func (q *Queue) pendingLocked() (uint16, error) {
	idx, err := q.readUint16(q.layout.AvailRing + 2)
	if err != nil {
		return 0, q.fail("reading available index: %w", err)
	}
	pending := idx - q.nextAvail
	if pending > q.layout.Size {
		return 0, q.fail("available index %d is %d entries ahead of the device (%d), more than the queue size %d",
			idx, pending, q.nextAvail, q.layout.Size)
	}
	return pending, nil
}

// Pop takes the next available chain. It returns (nil, nil) when the queue
// is empty; (nil, *ChainError) for a chain it refused and already completed
// with used length 0 (log it, rate-limited, and Pop again; the driver may
// need an interrupt: check NeedsInterrupt); or (nil, err) wrapping
// ErrQueueBroken, after which every call fails the same way.
func (q *Queue) Pop() (*Chain, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.broken != nil {
		return nil, q.broken
	}
	pending, err := q.pendingLocked()
	if err != nil {
		return nil, err
	}
	if pending == 0 {
		if !q.eventIdx {
			return nil, nil
		}
		// Ask for a notification once the driver adds past what we
		// consumed, then look again: it may have added meanwhile.
		if err := q.writeUint16(q.layout.UsedRing+4+8*uint64(q.layout.Size), q.nextAvail); err != nil {
			return nil, q.fail("writing avail_event: %w", err)
		}
		q.fence()
		if pending, err = q.pendingLocked(); err != nil || pending == 0 {
			return nil, err
		}
	}
	slot := uint64(q.nextAvail % q.layout.Size)
	head, err := q.readUint16(q.layout.AvailRing + 4 + 2*slot)
	if err != nil {
		return nil, q.fail("reading available ring slot %d: %w", slot, err)
	}
	q.nextAvail++
	chain, err := q.buildChain(head)
	if err != nil {
		if perr := q.pushLocked(head, 0); perr != nil {
			return nil, perr
		}
		return nil, &ChainError{Head: head, Err: err}
	}
	return chain, nil
}

// Push returns a chain to the driver through the used ring, reporting that
// the device wrote written bytes into its writable buffers (clamped to
// WritableLen). The used element is stored before the used index that
// publishes it. Push does not interrupt the driver; see NeedsInterrupt.
func (q *Queue) Push(c *Chain, written uint32) error {
	if c.queue != q {
		return errors.New("virtio: chain pushed to a queue it was not popped from")
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.pushed {
		return ErrAlreadyPushed
	}
	if q.broken != nil {
		return q.broken
	}
	c.pushed = true
	return q.pushLocked(c.head, min(written, c.writeLen))
}

// Complete is Push followed, when NeedsInterrupt says so, by
// irq.SignalUsed: the usual way to finish one chain.
func (q *Queue) Complete(c *Chain, written uint32, irq Interrupt) error {
	if err := q.Push(c, written); err != nil {
		return err
	}
	if q.NeedsInterrupt() {
		irq.SignalUsed()
	}
	return nil
}

func (q *Queue) pushLocked(id uint16, length uint32) error {
	elem := q.small[:8]
	binary.LittleEndian.PutUint32(elem[0:], uint32(id))
	binary.LittleEndian.PutUint32(elem[4:], length)
	slot := uint64(q.nextUsed % q.layout.Size)
	if err := q.mem.WriteAt(elem, q.layout.UsedRing+4+8*slot); err != nil {
		return q.fail("writing used ring slot %d: %w", slot, err)
	}
	q.fence()
	q.nextUsed++
	if err := q.writeUint16(q.layout.UsedRing+2, q.nextUsed); err != nil {
		return q.fail("writing used index: %w", err)
	}
	return nil
}

// NeedsInterrupt reports whether the driver wants an interrupt for the
// chains pushed since the last call: with EVENT_IDX, whether the used index
// passed the driver's used_event; without, whether anything was pushed and
// the driver did not set VIRTQ_AVAIL_F_NO_INTERRUPT. When in doubt (guest
// memory unreadable) it says yes.
func (q *Queue) NeedsInterrupt() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.fence()
	old, now := q.signalledUsed, q.nextUsed
	q.signalledUsed = now
	if q.eventIdx {
		usedEvent, err := q.readUint16(q.layout.AvailRing + 4 + 2*uint64(q.layout.Size))
		if err != nil {
			return true
		}
		// vring_need_event: did now pass usedEvent since old?
		return now-usedEvent-1 < now-old
	}
	if old == now {
		return false
	}
	flags, err := q.readUint16(q.layout.AvailRing)
	return err != nil || flags&AvailFlagNoInterrupt == 0
}

// descriptor is one descriptor as copied out of guest memory.
type descriptor struct {
	addr  uint64
	len   uint32
	flags uint16
	next  uint16
}

func decodeDescriptor(b []byte) descriptor {
	return descriptor{
		addr:  binary.LittleEndian.Uint64(b[0:]),
		len:   binary.LittleEndian.Uint32(b[8:]),
		flags: binary.LittleEndian.Uint16(b[12:]),
		next:  binary.LittleEndian.Uint16(b[14:]),
	}
}

// maxIndirectDescriptors bounds an indirect table (the spec bounds it only
// by the driver's memory); Linux uses at most a few hundred.
const maxIndirectDescriptors = MaxQueueSize

// indirectPrealloc is how many buffers a chain from an indirect table has
// room for up front: a 2 MiB request in 4 KiB pages.
const indirectPrealloc = 512

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidChain}, args...)...)
}

// chainBuilder accumulates a chain's buffers and enforces the
// per-chain rules that do not depend on where a descriptor came from.
type chainBuilder struct {
	q        *Queue
	chain    *Chain
	total    uint64
	writable bool
	readable int // how many buffers are readable (they come first)
}

func (b *chainBuilder) add(d descriptor) error {
	isWrite := d.flags&DescFlagWrite != 0
	if !isWrite && b.writable {
		return invalid("readable descriptor after a writable one")
	}
	b.writable = b.writable || isWrite
	if d.len == 0 {
		return nil
	}
	if err := checkRange(b.q.mem, d.addr, uint64(d.len)); err != nil {
		return invalid("buffer [%#x, +%#x) is not in guest memory: %w", d.addr, d.len, err)
	}
	b.total += uint64(d.len)
	if limit := b.q.chainByteLimit(); b.total > limit {
		return invalid("buffers total more than %d bytes", limit)
	}
	b.chain.bufs = append(b.chain.bufs, Buffer{Addr: d.addr, Len: d.len})
	if isWrite {
		b.chain.writeLen += d.len
	} else {
		b.readable++
		b.chain.readLen += d.len
	}
	return nil
}

// buildChain copies the chain starting at head out of guest memory and
// validates the copy.
func (q *Queue) buildChain(head uint16) (*Chain, error) {
	size := q.layout.Size
	if head >= size {
		return nil, invalid("head index %d out of range for queue size %d", head, size)
	}
	c := &Chain{head: head, queue: q}
	c.bufs = c.inline[:0]
	b := chainBuilder{q: q, chain: c}
	raw := q.small[:DescriptorSize]
	index := head
	for count := uint16(1); ; count++ {
		if err := q.mem.ReadAt(raw, q.layout.DescTable+DescriptorSize*uint64(index)); err != nil {
			return nil, fmt.Errorf("reading descriptor %d: %w", index, err)
		}
		d := decodeDescriptor(raw)
		if d.flags&DescFlagIndirect != 0 {
			if err := q.addIndirect(&b, d); err != nil {
				return nil, err
			}
			break
		}
		if err := b.add(d); err != nil {
			return nil, err
		}
		if d.flags&DescFlagNext == 0 {
			break
		}
		if d.next >= size {
			return nil, invalid("descriptor %d: next index %d out of range for queue size %d", index, d.next, size)
		}
		if count >= size {
			return nil, invalid("chain longer than the queue size %d (a loop?)", size)
		}
		index = d.next
	}
	c.readable = c.bufs[:b.readable:b.readable]
	c.writable = c.bufs[b.readable:]
	c.reader = ChainReader{mem: q.mem, bufs: c.readable, total: c.readLen}
	c.writer = ChainWriter{mem: q.mem, bufs: c.writable, total: c.writeLen}
	return c, nil
}

// addIndirect copies an indirect descriptor table once and adds its chain.
func (q *Queue) addIndirect(b *chainBuilder, d descriptor) error {
	switch {
	case !q.indirect:
		return invalid("indirect descriptor without VIRTIO_F_INDIRECT_DESC")
	case d.flags&DescFlagNext != 0:
		return invalid("indirect descriptor with the NEXT flag")
	case d.len == 0 || d.len%DescriptorSize != 0:
		return invalid("indirect table length %d is not a positive multiple of %d", d.len, DescriptorSize)
	case d.len/DescriptorSize > maxIndirectDescriptors:
		return invalid("indirect table of %d descriptors exceeds %d", d.len/DescriptorSize, maxIndirectDescriptors)
	}
	n := d.len / DescriptorSize
	if cap(q.scratch) < int(d.len) {
		q.scratch = make([]byte, d.len)
	}
	table := q.scratch[:d.len]
	if err := q.mem.ReadAt(table, d.addr); err != nil {
		return invalid("indirect table [%#x, +%#x) is not in guest memory: %w", d.addr, d.len, err)
	}
	// One allocation for a table of up to indirectPrealloc entries, not a
	// doubling per page of a 1 MiB request; capped, so a huge table whose
	// chain is one entry long costs no more.
	b.chain.bufs = slices.Grow(b.chain.bufs, int(min(n, indirectPrealloc)))
	index := uint32(0)
	for count := uint32(1); ; count++ {
		e := decodeDescriptor(table[DescriptorSize*index:])
		if e.flags&DescFlagIndirect != 0 {
			return invalid("nested indirect descriptor at indirect index %d", index)
		}
		if err := b.add(e); err != nil {
			return err
		}
		if e.flags&DescFlagNext == 0 {
			return nil
		}
		if uint32(e.next) >= n {
			return invalid("indirect index %d: next %d out of range for table of %d", index, e.next, n)
		}
		if count >= n {
			return invalid("indirect chain longer than its table of %d (a loop?)", n)
		}
		index = uint32(e.next)
	}
}
