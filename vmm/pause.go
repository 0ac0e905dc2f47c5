package vmm

import (
	"errors"
	"sync"
	"sync/atomic"
)

// pauser parks the vCPU threads between two KVM_RUNs, so that the VM's
// state (registers, irqchip, memory) holds still while it is read for a
// snapshot, and lets them go on.
//
// A vCPU parks only after a KVM_RUN returned EINTR: KVM first completes
// the exit served before (an OUT's RIP advance, an MMIO read's register
// load), so a parked vCPU has no half-done access in its state. No kick
// is lost: Pause stores request before it kicks (immediate_exit, then
// kickSignal); a thread sets immediate_exit itself when it sees request before
// a run, and a parked thread clears it before it looks at request again.
type pauser struct {
	mu      sync.Mutex // serialises Pause and Resume
	paused  bool
	request atomic.Bool
	resume  atomic.Pointer[chan struct{}] // closed by Resume
	parked  chan struct{}                 // one token per vCPU that parked
}

// Pause stops every vCPU between two runs and returns once all have
// stopped; the VM stays alive (devices keep running, Memory stays
// mapped). Not from a vCPU thread (a device's access): it would wait for
// itself. A no-op when already paused.
func (v *VM) Pause() error {
	p := &v.pause
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		return nil
	}
	v.mu.Lock()
	if !v.started || v.closed || v.exitRequested.Load() {
		v.mu.Unlock()
		return errors.New("vmm: Pause needs a running VM")
	}
	resume := make(chan struct{})
	p.resume.Store(&resume)
	p.request.Store(true)
	v.kickAllLocked()
	v.mu.Unlock()
	for range v.vcpus {
		select {
		case <-p.parked:
		case <-v.done:
			p.request.Store(false)
			return errors.New("vmm: the VM ended while pausing")
		}
	}
	p.paused = true
	return nil
}

// Resume lets the vCPUs of a paused VM run again. A no-op when not paused.
func (v *VM) Resume() {
	p := &v.pause
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		return
	}
	p.request.Store(false)
	close(*p.resume.Load())
	p.paused = false
}

// isPaused says whether Pause has stopped the vCPUs.
func (v *VM) isPaused() bool {
	v.pause.mu.Lock()
	defer v.pause.mu.Unlock()
	return v.pause.paused
}

// park holds vCPU thread t until Resume or the VM's end.
func (v *VM) park(t *vcpuThread) {
	resume := *v.pause.resume.Load()
	v.pause.parked <- struct{}{}
	select {
	case <-resume:
	case <-v.ending:
	}
	t.vcpu.RequestImmediateExit(false)
}
