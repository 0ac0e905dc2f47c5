package x86

import "fmt"

// fakeMemory is guest memory in a byte slice. Out-of-range accesses fail
// with an error, as the VMM's memory does.
type fakeMemory struct{ b []byte }

func newFakeMemory(size int) *fakeMemory { return &fakeMemory{b: make([]byte, size)} }

func (m *fakeMemory) WriteAt(p []byte, gpa uint64) error {
	if gpa > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-gpa {
		return fmt.Errorf("write [%#x, +%#x) outside %#x bytes of guest memory", gpa, len(p), len(m.b))
	}
	copy(m.b[gpa:], p)
	return nil
}

func (m *fakeMemory) ReadAt(p []byte, gpa uint64) error {
	if gpa > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-gpa {
		return fmt.Errorf("read [%#x, +%#x) outside %#x bytes of guest memory", gpa, len(p), len(m.b))
	}
	copy(p, m.b[gpa:])
	return nil
}

// failingMemory fails every write and read.
type failingMemory struct{}

func (failingMemory) WriteAt([]byte, uint64) error { return fmt.Errorf("injected write failure") }
func (failingMemory) ReadAt([]byte, uint64) error  { return fmt.Errorf("injected read failure") }
