package platform

import (
	"sync"
	"sync/atomic"
)

// The snapshot point: an I/O port through which the guest agent says it
// has started and dialed nothing yet (the moment a snapshot of the VM is
// worth taking, once, and restored on every later start), and learns when
// to go on and whether it runs in a VM restored from that snapshot.
const (
	// SnapshotPointPort is the port, next to the boot timer's.
	SnapshotPointPort = 0x3f4
	// SnapshotPointPortCount is how many ports it decodes.
	SnapshotPointPortCount = 1
	// SnapshotPointArrive is what the guest writes on arriving.
	SnapshotPointArrive = 1
)

// What a read of the port says. Any other value (0 or 0xff: no device)
// means go on: a VMM without the device never holds the guest.
const (
	SnapshotPointWait     = 0x10 // stay: the VMM is taking the snapshot
	SnapshotPointGo       = 0x11 // go on: this VM booted cold
	SnapshotPointRestored = 0x12 // go on: this VM was restored from a snapshot
)

// SnapshotPoint is the port's device. Safe for concurrent use.
type SnapshotPoint struct {
	answer  atomic.Uint32
	arrive  sync.Once
	arrived chan struct{}
}

// NewSnapshotPoint returns the device of a cold-booted VM: hold keeps a
// guest that arrives waiting until Release (the VMM takes the snapshot
// meanwhile); otherwise it goes on at once.
func NewSnapshotPoint(hold bool) *SnapshotPoint {
	p := &SnapshotPoint{arrived: make(chan struct{})}
	p.answer.Store(SnapshotPointGo)
	if hold {
		p.answer.Store(SnapshotPointWait)
	}
	return p
}

// NewRestoredSnapshotPoint returns the device of a VM restored from a
// snapshot: the guest, saved waiting at the point, goes on as restored.
func NewRestoredSnapshotPoint() *SnapshotPoint {
	p := &SnapshotPoint{arrived: make(chan struct{})}
	p.answer.Store(SnapshotPointRestored)
	return p
}

// Arrived is closed when the guest has arrived at the point.
func (p *SnapshotPoint) Arrived() <-chan struct{} { return p.arrived }

// Release lets a held guest go on (as cold-booted).
func (p *SnapshotPoint) Release() { p.answer.CompareAndSwap(SnapshotPointWait, SnapshotPointGo) }

// Read implements the bus device read: the answer.
func (p *SnapshotPoint) Read(offset uint64, data []byte) {
	clear(data)
	if offset == 0 && len(data) > 0 {
		data[0] = byte(p.answer.Load())
	}
}

// Write implements the bus device write: SnapshotPointArrive at offset 0
// marks the arrival (once); anything else is ignored.
func (p *SnapshotPoint) Write(offset uint64, data []byte) {
	if offset == 0 && len(data) > 0 && data[0] == SnapshotPointArrive {
		p.arrive.Do(func() { close(p.arrived) })
	}
}
