package vmm

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"golang.org/x/sys/unix"
)

// ioEvent is one KVM_IOEVENTFD registration and the goroutine that serves
// it: KVM signals the eventfd when the guest writes the value to the
// address, and the goroutine, parked in Go's poller on it, calls the
// handler.
//
// Why: without it the write is an MMIO exit, served on the vCPU's thread,
// and the device's worker it wakes must then be stolen by another thread of
// the Go runtime while that vCPU thread is back in KVM_RUN. Under a nested
// KVM with coarse timers that steal waited for a 4 ms scheduler tick on
// every request (measured in the file-sharing benchmark). With an eventfd
// the vCPU never leaves the guest for a notify, and the worker is woken by
// the thread that the poller woke.
type ioEvent struct {
	reg  kvm.IOEventFD
	file *os.File // the eventfd, non-blocking, so reads park in the poller
	done chan struct{}
}

// OnMMIOWrite makes a guest write of size bytes (1, 2, 4 or 8) of value at
// the MMIO address addr call fn, from a goroutine of the VM's, instead of
// exiting to the MMIO bus; writes of other values still reach the bus.
// Writes that come while fn runs are coalesced into one later call (the
// eventfd counts them), which suits a doorbell such as a virtqueue
// notify. The registration ends with CloseIOEvents or Close; fn is never
// called after either returns. An error (e.g. a KVM without
// KVM_CAP_IOEVENTFD) leaves the address served by the bus alone, which is
// correct, only slower.
func (v *VM) OnMMIOWrite(addr uint64, size uint32, value uint64, fn func()) error {
	return v.onMMIOWrite(addr, size, value, fn)
}

// onMMIOWrite registers the ioeventfd; a nil fn leaves it unread.
func (v *VM) onMMIOWrite(addr uint64, size uint32, value uint64, fn func()) error {
	flags := unix.EFD_CLOEXEC
	if fn != nil {
		flags |= unix.EFD_NONBLOCK // read in Go's poller
	} // else blocking, so os.NewFile keeps it out of the poller: no wake-ups
	fd, err := unix.Eventfd(0, flags)
	if err != nil {
		return fmt.Errorf("eventfd for MMIO %#x: %w", addr, err)
	}
	e := &ioEvent{
		reg:  kvm.IOEventFD{Addr: addr, Len: size, EventFD: fd, Datamatch: &value},
		file: os.NewFile(uintptr(fd), fmt.Sprintf("ioeventfd-%#x-%d", addr, value)),
		done: make(chan struct{}),
	}
	v.ioMu.Lock()
	defer v.ioMu.Unlock()
	if v.ioClosed {
		e.file.Close()
		return errors.New("vmm: OnMMIOWrite after the VM's I/O events were closed")
	}
	if err := v.kvm.SetIOEventFD(e.reg, true); err != nil {
		e.file.Close()
		return err
	}
	v.ioEvents = append(v.ioEvents, e)
	if fn == nil {
		close(e.done)
		return nil
	}
	go e.serve(fn)
	return nil
}

// AbsorbMMIOWrite makes a guest write of size bytes of value at the MMIO
// address addr end in KVM: it signals an eventfd that nothing reads, so the
// write costs the guest no exit to us and no goroutine wakes. For writes
// whose effect the device model already has (an interrupt acknowledgement
// that the status read did). Ends with CloseIOEvents or Close; an error
// leaves the address served by the bus.
func (v *VM) AbsorbMMIOWrite(addr uint64, size uint32, value uint64) error {
	return v.onMMIOWrite(addr, size, value, nil)
}

// serve calls fn once per wake of the eventfd until the file is closed.
func (e *ioEvent) serve(fn func()) {
	defer close(e.done)
	var count [8]byte
	for {
		if _, err := e.file.Read(count[:]); err != nil {
			return // closed (os.ErrClosed); an eventfd read fails no other way
		}
		fn()
	}
}

// CloseIOEvents ends every OnMMIOWrite registration and waits for their
// goroutines, so no handler runs after it returns: call it once the vCPUs
// have stopped and before the devices behind the handlers are reset. Later
// guest writes to those addresses (there are none once the vCPUs stopped)
// would reach the bus. Safe to call more than once.
func (v *VM) CloseIOEvents() error {
	v.ioMu.Lock()
	events := v.ioEvents
	v.ioEvents = nil
	v.ioClosed = true
	v.ioMu.Unlock()
	var errs []error
	for _, e := range events {
		if err := v.kvm.SetIOEventFD(e.reg, false); err != nil {
			errs = append(errs, err)
		}
		// Closing the file wakes the goroutine parked in Read.
		if err := e.file.Close(); err != nil {
			errs = append(errs, err)
		}
		<-e.done
	}
	return errors.Join(errs...)
}

// ioEventState is the VM's part: its registrations.
type ioEventState struct {
	ioMu     sync.Mutex
	ioEvents []*ioEvent
	ioClosed bool
}
