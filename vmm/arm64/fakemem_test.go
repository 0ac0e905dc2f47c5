package arm64

import (
	"errors"
	"fmt"
)

// fakeMemory is guest RAM of size bytes at RAMBase that keeps only what was
// written (so a test can have a 1 GiB guest), in write order. Writes
// outside RAM fail with an error, as the VMM's memory does.
type fakeMemory struct {
	size   uint64
	chunks []memChunk
}

type memChunk struct {
	gpa  uint64
	data []byte
}

func newFakeMemory(size uint64) *fakeMemory { return &fakeMemory{size: size} }

func (m *fakeMemory) inRAM(gpa uint64, n int) bool {
	return gpa >= RAMBase && gpa-RAMBase <= m.size && uint64(n) <= m.size-(gpa-RAMBase)
}

func (m *fakeMemory) WriteAt(p []byte, gpa uint64) error {
	if !m.inRAM(gpa, len(p)) {
		return fmt.Errorf("write [%#x, +%#x) outside guest RAM [%#x, +%#x)", gpa, len(p), RAMBase, m.size)
	}
	m.chunks = append(m.chunks, memChunk{gpa, append([]byte(nil), p...)})
	return nil
}

// read returns n bytes at gpa as the writes left them (zeros elsewhere).
func (m *fakeMemory) read(gpa uint64, n int) ([]byte, error) {
	if !m.inRAM(gpa, n) {
		return nil, fmt.Errorf("read [%#x, +%#x) outside guest RAM", gpa, n)
	}
	out := make([]byte, n)
	end := gpa + uint64(n)
	for _, c := range m.chunks {
		cEnd := c.gpa + uint64(len(c.data))
		if c.gpa >= end || cEnd <= gpa {
			continue
		}
		lo, hi := max(gpa, c.gpa), min(end, cEnd)
		copy(out[lo-gpa:hi-gpa], c.data[lo-c.gpa:hi-c.gpa])
	}
	return out, nil
}

// written returns the [start, end) ranges written, in order.
func (m *fakeMemory) written() [][2]uint64 {
	var r [][2]uint64
	for _, c := range m.chunks {
		r = append(r, [2]uint64{c.gpa, c.gpa + uint64(len(c.data))})
	}
	return r
}

// failingMemory fails every write.
type failingMemory struct{}

var errInjected = errors.New("injected write failure")

func (failingMemory) WriteAt([]byte, uint64) error { return errInjected }
