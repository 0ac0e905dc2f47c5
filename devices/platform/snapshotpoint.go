package platform

import (
	"sync"
	"sync/atomic"

	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// The snapshot point (guesthost.SnapshotPointPort): an I/O port through
// which the guest agent says it has started and dialled nothing yet (the
// moment a snapshot of the VM is worth taking, once, and restored on every
// later start), and learns when to go on and whether it runs in a VM
// restored from that snapshot. The values it reads and writes are
// guesthost's SnapshotPoint constants.

// SnapshotPointPortCount is how many ports it decodes.
const SnapshotPointPortCount = 1

// SnapshotPoint is the port's device. Safe for concurrent use.
type SnapshotPoint struct {
	answer atomic.Uint32

	mu      sync.Mutex
	arrived chan struct{}
	open    bool // arrived is not closed yet
}

// NewSnapshotPoint returns the device of a cold-booted VM: hold keeps a
// guest that arrives waiting until Release (the VMM takes the snapshot
// meanwhile); otherwise it goes on at once.
func NewSnapshotPoint(hold bool) *SnapshotPoint {
	p := &SnapshotPoint{arrived: make(chan struct{}), open: true}
	p.answer.Store(guesthost.SnapshotPointGo)
	if hold {
		p.answer.Store(guesthost.SnapshotPointWait)
	}
	return p
}

// NewRestoredSnapshotPoint returns the device of a VM restored from a
// snapshot: the guest, saved waiting at the point, goes on as restored.
func NewRestoredSnapshotPoint() *SnapshotPoint {
	p := &SnapshotPoint{arrived: make(chan struct{}), open: true}
	p.answer.Store(guesthost.SnapshotPointRestored)
	return p
}

// Hold makes the point hold the guest's next arrival (a suspended guest's
// agent arrives again: the VMM saves the VM meanwhile and never lets it
// go on). Arrived then reports that next arrival.
func (p *SnapshotPoint) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answer.Store(guesthost.SnapshotPointWait)
	if !p.open {
		p.arrived, p.open = make(chan struct{}), true
	}
}

// Arrived is closed when the guest has arrived at the point (since the
// last Hold).
func (p *SnapshotPoint) Arrived() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.arrived
}

// Release lets a held guest go on (as cold-booted).
func (p *SnapshotPoint) Release() {
	p.answer.CompareAndSwap(guesthost.SnapshotPointWait, guesthost.SnapshotPointGo)
}

// Read implements the bus device read: the answer.
func (p *SnapshotPoint) Read(offset uint64, data []byte) {
	clear(data)
	if offset == 0 && len(data) > 0 {
		data[0] = byte(p.answer.Load())
	}
}

// Write implements the bus device write: guesthost.SnapshotPointArrive at
// offset 0 marks the arrival (once per Hold); anything else is ignored.
func (p *SnapshotPoint) Write(offset uint64, data []byte) {
	if offset != 0 || len(data) == 0 || data[0] != guesthost.SnapshotPointArrive {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		close(p.arrived)
		p.open = false
	}
}
