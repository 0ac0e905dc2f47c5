package vmm

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// Device is anything registered on a bus. Offsets are relative to the base
// the device was registered at; len(data) is the access size (1, 2, 4 or 8;
// MMIO may be any size up to 8). Read fills data (it arrives zeroed); Write
// consumes it. Methods are called concurrently from several vCPU threads, so
// implementations must be safe for concurrent use, and must not block for
// long: the vCPU is stopped until they return.
type Device interface {
	Read(offset uint64, data []byte)
	Write(offset uint64, data []byte)
}

// Bus maps address ranges to devices. An access that no device claims
// entirely is logged (rate-limited) and ignored; a read of it returns the
// bus's fill byte — 0xff on the port-I/O bus, like a PC's floating ISA bus
// (Linux probes for absent legacy devices expect all-ones), and 0x00 on the
// MMIO bus. It never ends the vCPU loop. Safe for concurrent use.
type Bus struct {
	name   string
	fill   byte
	log    *ratelog.Logger // unclaimed accesses, at ratelog's default rate
	mu     sync.RWMutex
	ranges []busRange // sorted by base, non-overlapping
}

type busRange struct {
	base, size uint64
	dev        Device
}

// NewPIOBus returns an empty port-I/O bus (unclaimed reads: 0xff).
func NewPIOBus(log *slog.Logger) *Bus { return newBus("port I/O", 0xff, log) }

// NewMMIOBus returns an empty MMIO bus (unclaimed reads: 0x00).
func NewMMIOBus(log *slog.Logger) *Bus { return newBus("MMIO", 0x00, log) }

func newBus(name string, fill byte, log *slog.Logger) *Bus {
	if log == nil {
		log = slog.Default()
	}
	return &Bus{name: name, fill: fill, log: ratelog.New(log, nil)}
}

// Register attaches d at [base, base+size). Overlapping an existing range,
// size 0 or a range wrapping past 2^64 is refused.
func (b *Bus) Register(base, size uint64, d Device) error {
	if d == nil {
		return fmt.Errorf("%s bus: nil device at %#x", b.name, base)
	}
	if size == 0 || base+size < base {
		return fmt.Errorf("%s bus: invalid range [%#x, +%#x)", b.name, base, size)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i := sort.Search(len(b.ranges), func(i int) bool { return b.ranges[i].base >= base })
	if i > 0 {
		prev := b.ranges[i-1]
		if prev.base+prev.size > base {
			return fmt.Errorf("%s bus: [%#x, +%#x) overlaps the device at [%#x, +%#x)", b.name, base, size, prev.base, prev.size)
		}
	}
	if i < len(b.ranges) && base+size > b.ranges[i].base {
		next := b.ranges[i]
		return fmt.Errorf("%s bus: [%#x, +%#x) overlaps the device at [%#x, +%#x)", b.name, base, size, next.base, next.size)
	}
	b.ranges = append(b.ranges, busRange{})
	copy(b.ranges[i+1:], b.ranges[i:])
	b.ranges[i] = busRange{base: base, size: size, dev: d}
	return nil
}

// lookup returns the device fully containing [addr, addr+n) and the offset.
func (b *Bus) lookup(addr uint64, n int) (Device, uint64, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	i := sort.Search(len(b.ranges), func(i int) bool { return b.ranges[i].base > addr }) - 1
	if i < 0 {
		return nil, 0, false
	}
	r := b.ranges[i]
	off := addr - r.base
	if off >= r.size || uint64(n) > r.size-off {
		return nil, 0, false
	}
	return r.dev, off, true
}

// Read dispatches a guest read of len(data) bytes at addr.
func (b *Bus) Read(addr uint64, data []byte) {
	clear(data)
	if d, off, ok := b.lookup(addr, len(data)); ok {
		d.Read(off, data)
		return
	}
	for i := range data {
		data[i] = b.fill
	}
	b.unclaimed("read", addr, len(data))
}

// Write dispatches a guest write of data at addr.
func (b *Bus) Write(addr uint64, data []byte) {
	if d, off, ok := b.lookup(addr, len(data)); ok {
		d.Write(off, data)
		return
	}
	b.unclaimed("write", addr, len(data))
}

func (b *Bus) unclaimed(op string, addr uint64, n int) {
	b.log.Debug("guest accessed an address no device claims",
		"bus", b.name, "op", op, "addr", fmt.Sprintf("%#x", addr), "size", n)
}
