package virtiotest

import (
	"fmt"
	"sort"
)

// span is a free range of guest memory.
type span struct{ addr, size uint64 }

// allocator hands out aligned ranges of guest memory, first fit, and
// coalesces freed ranges. Not safe for concurrent use (the Driver locks).
type allocator struct {
	free []span // sorted by addr, non-adjacent
}

func newAllocator(start, end uint64) *allocator {
	return &allocator{free: []span{{start, end - start}}}
}

func (a *allocator) alloc(size, align uint64) (uint64, error) {
	if size == 0 {
		size = 1
	}
	for i, s := range a.free {
		addr := (s.addr + align - 1) &^ (align - 1)
		if addr+size > s.addr+s.size {
			continue
		}
		// Split s into [s.addr, addr) and [addr+size, end).
		end := s.addr + s.size
		var rest []span
		if addr > s.addr {
			rest = append(rest, span{s.addr, addr - s.addr})
		}
		if addr+size < end {
			rest = append(rest, span{addr + size, end - addr - size})
		}
		a.free = append(a.free[:i], append(rest, a.free[i+1:]...)...)
		return addr, nil
	}
	return 0, fmt.Errorf("virtiotest: guest memory exhausted allocating %d bytes (raise Options.MemSize or collect used buffers)", size)
}

func (a *allocator) release(addr, size uint64) {
	if size == 0 {
		size = 1
	}
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].addr > addr })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{addr, size}
	// Merge with the next, then with the previous.
	if i+1 < len(a.free) && a.free[i].addr+a.free[i].size == a.free[i+1].addr {
		a.free[i].size += a.free[i+1].size
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].addr+a.free[i-1].size == a.free[i].addr {
		a.free[i-1].size += a.free[i].size
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
}
