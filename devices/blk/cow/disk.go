package cow

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
)

// ErrClosed is returned by every method of a closed Disk.
var ErrClosed = errors.New("cow: disk is closed")

// Disk is a blk.Backing: a base read through a copy-on-write overlay.
// Create it with Open. Its methods may be called from any goroutine; one
// mutex serializes them (the device's worker calls one at a time anyway).
type Disk struct {
	mu       sync.Mutex
	name     string
	identity string
	l        layout
	base     blk.Backing // the base image's file; only read
	baseOff  int64       // the region's offset in it
	overlay  blk.Backing // the overlay file: slots, then data at l.dataOffset
	states   []byte      // the live map, packed as on disk
	gen      uint64      // the generation committed last
	dirty    bool        // states differ from generation gen
	closed   bool
	cluster  []byte    // scratch for a copy-up, ClusterSize
	slotBuf  []byte    // scratch for a commit, l.slotSize
	part     [][]byte  // scratch: the part of a request one run moves
	single   [1][]byte // scratch: the iovec of a copy-up
}

var _ blk.Backing = (*Disk)(nil)

func newDisk(base Base, l layout, baseFile, overlay blk.Backing, loaded slot) *Disk {
	return &Disk{
		name:     fmt.Sprintf("%s over %s[%d,+%d)", overlay.Name(), base.File.Name(), base.Offset, base.Length),
		identity: base.Identity, l: l,
		base: baseFile, baseOff: base.Offset, overlay: overlay,
		states: loaded.states, gen: loaded.gen,
		cluster: make([]byte, ClusterSize), slotBuf: make([]byte, l.slotSize),
	}
}

// Name implements blk.Backing.
func (d *Disk) Name() string { return d.name }

// Size implements blk.Backing: the base region's length.
func (d *Disk) Size() int64 { return d.l.baseSize }

// Generation is the map generation committed last (1 for a fresh
// overlay): it grows with each Flush that changed the map.
func (d *Disk) Generation() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gen
}

// state returns cluster c's state.
func (d *Disk) state(c int64) byte { return d.states[c/4] >> (2 * (c % 4)) & 3 }

// setState sets cluster c's state, noting that the map changed.
func (d *Disk) setState(c int64, s byte) {
	shift := 2 * (c % 4)
	old := d.states[c/4]
	next := old&^(3<<shift) | s<<shift
	if next != old {
		d.states[c/4] = next
		d.dirty = true
	}
}

// span returns the bytes of cluster c: the last cluster of a base that is
// not a whole number of clusters is short.
func (d *Disk) span(c int64) (start, length int64) {
	start = c * ClusterSize
	return start, min(ClusterSize, d.l.baseSize-start)
}

// check refuses a closed disk and a range outside it: the device checked
// already, but the disk keeps its own guarantees.
func (d *Disk) check(off, size int64) error {
	switch {
	case d.closed:
		return ErrClosed
	case off < 0 || size < 0 || off > d.l.baseSize || size > d.l.baseSize-off:
		return fmt.Errorf("cow: range [%d, +%d) outside the disk of %d bytes", off, size, d.l.baseSize)
	}
	return nil
}

// Flush implements blk.Backing: it commits the map (see commit).
func (d *Disk) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	return d.commit()
}

// Close commits the map a last time; the disk then refuses every call.
// The files stay open: they are the caller's.
func (d *Disk) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	return d.commit()
}

// commit makes every completed write stable and then records the map.
// The order is the crash-safety argument (doc.go): the overlay's data is
// synced first, so a map on disk never claims a cluster whose copy is
// not durable; the map then goes to the slot the last commit did not
// use, and is synced, so a torn slot leaves the previous generation whole.
// A failed commit leaves gen as it was: the next one rewrites that slot.
func (d *Disk) commit() error {
	if err := d.overlay.Flush(); err != nil {
		return fmt.Errorf("cow: syncing the overlay's data: %w", err)
	}
	if !d.dirty {
		return nil
	}
	next := d.gen + 1
	encodeSlot(d.slotBuf, d.l, next, d.identity, d.states)
	if err := d.overlay.WriteV([][]byte{d.slotBuf}, d.l.slotOffset(next)); err != nil {
		return fmt.Errorf("cow: writing map generation %d: %w", next, err)
	}
	if err := d.overlay.Flush(); err != nil {
		return fmt.Errorf("cow: syncing map generation %d: %w", next, err)
	}
	d.gen, d.dirty = next, false
	return nil
}
