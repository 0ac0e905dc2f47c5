package vmm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"golang.org/x/sys/unix"
)

// IRQLine is an interrupt line into the guest's in-kernel irqchip. Trigger
// raises one edge. Safe for concurrent use, never blocks for long. This is
// the same shape as devices.IRQ, so a line can be handed to any device.
type IRQLine interface {
	Trigger() error
}

// ErrIRQClosed is returned by Trigger after the VM is closed.
var ErrIRQClosed = errors.New("interrupt line closed: the VM has ended")

// irqfdLine pulses a GSI through an eventfd bound with KVM_IRQFD: a Trigger
// is one write(2), with no ioctl and no exit.
type irqfdLine struct {
	gsi    uint32
	mu     sync.RWMutex // held for reading while writing to fd
	fd     int
	closed bool
}

func newIRQFDLine(vm *kvm.VM, gsi uint32) (*irqfdLine, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd for GSI %d: %w", gsi, err)
	}
	if err := vm.IRQFD(fd, gsi); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &irqfdLine{gsi: gsi, fd: fd}, nil
}

// Trigger raises GSI once.
func (l *irqfdLine) Trigger() error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return ErrIRQClosed
	}
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	for {
		_, err := unix.Write(l.fd, one[:])
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			// The counter is saturated: an interrupt is already pending,
			// which is all an edge needs.
			return nil
		default:
			return fmt.Errorf("raising GSI %d: %w", l.gsi, err)
		}
	}
}

// close closes the eventfd (KVM drops the irqfd binding when it sees the
// eventfd close). Later Triggers return ErrIRQClosed instead of writing to a
// reused descriptor.
func (l *irqfdLine) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	return unix.Close(l.fd)
}

// LevelIRQLine drives a GSI with KVM_IRQ_LINE, for level-triggered sources:
// SetLevel(true) asserts it until SetLevel(false). Trigger pulses it (an
// edge). Safe for concurrent use.
type LevelIRQLine struct {
	gsi uint32
	vm  *VM
}

// SetLevel asserts (true) or deasserts the line.
func (l *LevelIRQLine) SetLevel(high bool) error {
	return l.vm.irqLine(l.gsi, high)
}

// Trigger pulses the line: assert, then deassert.
func (l *LevelIRQLine) Trigger() error {
	if err := l.SetLevel(true); err != nil {
		return err
	}
	return l.SetLevel(false)
}
