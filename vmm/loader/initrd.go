package loader

import (
	"errors"
	"fmt"
	"io"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// ErrNoRoom is returned when the initrd does not fit.
var ErrNoRoom = errors.New("no room in guest memory")

// InitrdSource is an initrd that knows its exact size before it is
// written, so it can be placed first and then streamed straight into guest
// memory: the VMM never holds a copy of it.
type InitrdSource interface {
	// Size is the initrd's length in bytes.
	Size() uint64
	// WriteTo writes exactly Size bytes to guest memory at addr.
	WriteTo(mem x86.GuestWriter, addr uint64) error
}

// InitrdBytes is an initrd held in memory.
type InitrdBytes []byte

// Size implements InitrdSource.
func (b InitrdBytes) Size() uint64 { return uint64(len(b)) }

// WriteTo implements InitrdSource.
func (b InitrdBytes) WriteTo(mem x86.GuestWriter, addr uint64) error { return mem.WriteAt(b, addr) }

// LoadInitrd copies initrd into guest memory of memBytes bytes, page-aligned
// at the highest address that keeps it below the MMIO hole, below memBytes
// and at or below maxAddr (the kernel's initrd_addr_max, Kernel.InitrdAddrMax;
// 0 means x86.DefaultInitrdAddrMax), and above kernelEnd (Kernel.LoadEnd) so
// it never overlaps the kernel. It returns the initrd's guest address.
// Linux moves the initrd if it needs the memory, so the top of low RAM
// keeps it out of the kernel's early allocations.
func LoadInitrd(mem x86.GuestWriter, initrd []byte, memBytes, kernelEnd, maxAddr uint64) (addr uint64, err error) {
	return LoadInitrdFrom(mem, InitrdBytes(initrd), memBytes, kernelEnd, maxAddr)
}

// LoadInitrdFrom is LoadInitrd for an InitrdSource: it places the initrd
// by its size, then has it write itself there.
func LoadInitrdFrom(mem x86.GuestWriter, initrd InitrdSource, memBytes, kernelEnd, maxAddr uint64) (addr uint64, err error) {
	size := initrd.Size()
	if size == 0 {
		return 0, fmt.Errorf("%w: the initrd is empty", ErrNoRoom)
	}
	if err := x86.CheckMemorySize(memBytes); err != nil {
		return 0, err
	}
	if maxAddr == 0 {
		maxAddr = x86.DefaultInitrdAddrMax
	}
	top := lowRAMEnd(memBytes)
	if maxAddr < top {
		top = maxAddr + 1 // maxAddr is the last usable byte
	}
	floor := (max(kernelEnd, x86.HighMemStart) + x86.InitrdAlign - 1) &^ (x86.InitrdAlign - 1)
	if floor < kernelEnd || size > top || (top-size)&^(x86.InitrdAlign-1) < floor {
		return 0, fmt.Errorf("%w: initrd of %d bytes does not fit between the kernel's end %#x and %#x; give the guest more memory or use a smaller initrd", ErrNoRoom, size, kernelEnd, top)
	}
	addr = (top - size) &^ (x86.InitrdAlign - 1)
	if err := initrd.WriteTo(mem, addr); err != nil {
		return 0, fmt.Errorf("write initrd at %#x: %w", addr, err)
	}
	return addr, nil
}

// GuestStream is an io.Writer onto Limit bytes of guest memory from Addr:
// what an InitrdSource uses to stream an archive in. A write past Limit
// fails, so a source that grows while being written cannot spill over
// what was placed after it.
type GuestStream struct {
	mem     x86.GuestWriter
	addr    uint64
	limit   uint64
	written uint64
}

// NewGuestStream returns a GuestStream writing [addr, addr+limit).
func NewGuestStream(mem x86.GuestWriter, addr, limit uint64) *GuestStream {
	return &GuestStream{mem: mem, addr: addr, limit: limit}
}

// ErrStreamFull is returned by a write past a GuestStream's limit.
var ErrStreamFull = errors.New("write beyond the space reserved in guest memory")

// Write implements io.Writer.
func (s *GuestStream) Write(p []byte) (int, error) {
	room := s.limit - s.written
	if uint64(len(p)) > room {
		return 0, fmt.Errorf("%w (%d bytes reserved)", ErrStreamFull, s.limit)
	}
	if err := s.mem.WriteAt(p, s.addr+s.written); err != nil {
		return 0, err
	}
	s.written += uint64(len(p))
	return len(p), nil
}

// Written is the number of bytes written so far.
func (s *GuestStream) Written() uint64 { return s.written }

// ErrStreamShort is returned by WriteStream when fewer bytes came than were
// reserved.
var ErrStreamShort = errors.New("fewer bytes than the space reserved in guest memory")

// WriteStream has write fill exactly size bytes of guest memory from addr
// through a GuestStream: more fails the write that overruns (ErrStreamFull),
// fewer fails with ErrStreamShort. It is how an InitrdSource that learned
// its size from a stat writes itself.
func WriteStream(mem x86.GuestWriter, addr, size uint64, write func(io.Writer) error) error {
	w := NewGuestStream(mem, addr, size)
	if err := write(w); err != nil {
		return err
	}
	if w.written != size {
		return fmt.Errorf("%w: %d of %d bytes", ErrStreamShort, w.written, size)
	}
	return nil
}
