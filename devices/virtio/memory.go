package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
)

// GuestMemory is the guest's RAM as the device sees it. ReadAt and WriteAt
// copy all of p or fail with an error (never a partial copy, never a panic),
// whatever gpa and len(p) the guest chose. The VMM's memory type implements
// it; [SliceMemory] is the test double. Safe for concurrent use.
type GuestMemory interface {
	ReadAt(p []byte, gpa uint64) error
	WriteAt(p []byte, gpa uint64) error
}

// RangeChecker is an optional interface of a GuestMemory: CheckRange reports
// an error unless [gpa, gpa+length) lies entirely in guest RAM. Queues use
// it, when present, to refuse a buffer before any access; without it they
// probe the first and last byte, and a buffer spanning a hole between RAM
// regions is caught at access time instead.
type RangeChecker interface {
	CheckRange(gpa, length uint64) error
}

// Slicer is an optional interface of a GuestMemory, for devices that do
// host I/O straight into and out of guest buffers (zero-copy): Slice
// returns the host bytes backing [gpa, gpa+n), or an error unless that
// range lies in one piece of guest RAM. The bytes are the guest's: it may
// change them at any time, so never parse them in place more than once.
// The slice stays valid while the device is active; a device must stop
// using every slice before its Reset returns (the VMM unmaps guest memory
// only after resetting its devices).
type Slicer interface {
	Slice(gpa, n uint64) ([]byte, error)
}

// Discarder is an optional interface of a GuestMemory, for the balloon:
// Discard gives the host memory behind [gpa, gpa+length) back to the host
// at once (gpa and length multiples of PageSize, the range in one piece
// of guest RAM, else an error and nothing discarded) and says how many
// bytes went: on a host whose pages are larger than PageSize (16 or 64
// KiB on some arm64 machines) only the whole host pages inside the range
// can go, and the rest stays. The guest reads zeros where memory went
// (or, for RAM mapped from a snapshot, the snapshot's bytes): what a
// driver hands back it no longer reads.
type Discarder interface {
	Discard(gpa, length uint64) (discarded uint64, err error)
}

// PageSize is the unit of Discarder.Discard and of balloon page numbers.
const PageSize = 4096

// ErrOutOfRange is wrapped by SliceMemory for accesses outside its bytes.
var ErrOutOfRange = errors.New("virtio: guest memory access out of range")

// SliceMemory is a GuestMemory backed by a byte slice starting at guest
// physical address 0, for tests and fuzzing. Every access takes a lock, so a
// test driver and device goroutines can share it under the race detector.
type SliceMemory struct {
	mu  sync.RWMutex
	buf []byte
}

// NewSliceMemory returns size bytes of zeroed guest memory.
func NewSliceMemory(size int) *SliceMemory {
	return &SliceMemory{buf: make([]byte, size)}
}

// Size returns the memory's length in bytes.
func (m *SliceMemory) Size() uint64 { return uint64(len(m.buf)) }

// CheckRange implements RangeChecker.
func (m *SliceMemory) CheckRange(gpa, length uint64) error {
	size := uint64(len(m.buf))
	if gpa > size || length > size-gpa {
		return fmt.Errorf("%w: [%#x, +%#x) outside %#x bytes", ErrOutOfRange, gpa, length, size)
	}
	return nil
}

// ReadAt implements GuestMemory.
func (m *SliceMemory) ReadAt(p []byte, gpa uint64) error {
	if err := m.CheckRange(gpa, uint64(len(p))); err != nil {
		return err
	}
	m.mu.RLock()
	copy(p, m.buf[gpa:])
	m.mu.RUnlock()
	return nil
}

// WriteAt implements GuestMemory.
func (m *SliceMemory) WriteAt(p []byte, gpa uint64) error {
	if err := m.CheckRange(gpa, uint64(len(p))); err != nil {
		return err
	}
	m.mu.Lock()
	copy(m.buf[gpa:], p)
	m.mu.Unlock()
	return nil
}

// Discard implements Discarder: it zeroes the range, as the host's
// discard leaves an anonymous mapping.
func (m *SliceMemory) Discard(gpa, length uint64) (uint64, error) {
	if gpa%PageSize != 0 || length%PageSize != 0 {
		return 0, fmt.Errorf("virtio: discard of [%#x, +%#x): not page-aligned", gpa, length)
	}
	if err := m.CheckRange(gpa, length); err != nil {
		return 0, err
	}
	m.mu.Lock()
	clear(m.buf[gpa : gpa+length])
	m.mu.Unlock()
	return length, nil
}

// Uint16 reads a little-endian uint16 at gpa.
func (m *SliceMemory) Uint16(gpa uint64) (uint16, error) {
	var b [2]byte
	err := m.ReadAt(b[:], gpa)
	return binary.LittleEndian.Uint16(b[:]), err
}

// Uint32 reads a little-endian uint32 at gpa.
func (m *SliceMemory) Uint32(gpa uint64) (uint32, error) {
	var b [4]byte
	err := m.ReadAt(b[:], gpa)
	return binary.LittleEndian.Uint32(b[:]), err
}

// PutUint16 writes a little-endian uint16 at gpa.
func (m *SliceMemory) PutUint16(gpa uint64, v uint16) error {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], v)
	return m.WriteAt(b[:], gpa)
}

// PutUint32 writes a little-endian uint32 at gpa.
func (m *SliceMemory) PutUint32(gpa uint64, v uint32) error {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	return m.WriteAt(b[:], gpa)
}

// PutUint64 writes a little-endian uint64 at gpa.
func (m *SliceMemory) PutUint64(gpa uint64, v uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return m.WriteAt(b[:], gpa)
}

// Slice implements Slicer. The slice bypasses the lock: a device and a
// test driver must order their accesses to it through the queues (as a
// real guest and device do).
func (m *SliceMemory) Slice(gpa, n uint64) ([]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if gpa > uint64(len(m.buf)) || n > uint64(len(m.buf))-gpa {
		return nil, fmt.Errorf("%w: [%#x, +%#x)", ErrOutOfRange, gpa, n)
	}
	return m.buf[gpa : gpa+n : gpa+n], nil
}
