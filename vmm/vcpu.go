package vmm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"golang.org/x/sys/unix"
)

// vcpuThread is one vCPU and the OS thread running it.
type vcpuThread struct {
	index int
	vcpu  *kvm.VCPU
	// cpuid is the table the vCPU was given (KVM_SET_CPUID2): a snapshot
	// records it and restores only into a vCPU given the same.
	cpuid []kvm.CPUIDEntry

	mu    sync.Mutex // guards tid and running, so a kick never hits a thread that left
	tid   int
	alive bool
}

// kick makes the vCPU leave KVM_RUN: immediate_exit covers a thread that is
// between runs (it returns EINTR at its next entry), kickSignal one that is
// in the guest or halted in the kernel. Called with the VM's mu held.
func (t *vcpuThread) kick() {
	t.vcpu.RequestImmediateExit(true)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.alive {
		// ESRCH is impossible while alive is set; other errors would only
		// mean the thread leaves at its next entry thanks to immediate_exit.
		_ = unix.Tgkill(unix.Getpid(), t.tid, kickSignal)
	}
}

// kickSignal is the signal a kick sends: a real-time signal (SIGRTMIN+8 in
// the kernel's numbering) that nothing else here sends. The Go runtime
// installs its handler for every real-time signal and, when the program
// has not asked for one with os/signal, returns from it without effect,
// so a kick never kills the process. It is one of the two signals that
// interrupt the guest's execution (guestSignals).
const kickSignal = unix.Signal(40)

// perThreadSyscallSignal is the Go runtime's signal for a system call
// every thread must make (syscall.AllThreadsSyscall, which Setuid and
// friends use without cgo): SIGRTMIN+1. A vCPU thread must take it at
// once, or the caller waits for the guest's next exit.
const perThreadSyscallSignal = unix.Signal(33)

// guestSignals limits the signals that interrupt this vCPU's guest to the
// kick and perThreadSyscallSignal. Why: the Go runtime's sysmon sends
// SIGURG to a thread that stayed 10 ms in one system call, and KVM_RUN is
// one (guest time): every such signal was an exit and a return to KVM_RUN
// for nothing. Nested, that was about one exit per file-sharing request.
// The others stay pending until the vCPU exits for its own reasons. An
// error leaves every signal let through, as before: correct, slower.
func (v *VM) guestSignals(t *vcpuThread) {
	if err := t.vcpu.SetGuestSignals(kickSignal, perThreadSyscallSignal); err != nil {
		v.log.Debug("vmm: every signal still interrupts the guest", "vcpu", t.index, "err", err)
	}
}

// runVCPU is the body of a vCPU thread: KVM_RUN until the VM is asked to end.
func (v *VM) runVCPU(t *vcpuThread) {
	defer v.wg.Done()
	// KVM requires every KVM_RUN of a vCPU to come from one thread, and the
	// kick targets that thread by id.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	v.guestSignals(t)
	t.mu.Lock()
	t.tid = unix.Gettid()
	t.alive = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.alive = false
		t.mu.Unlock()
	}()
	defer v.logCounters(t)

	for !v.exitRequested.Load() {
		if v.pause.request.Load() {
			// A KVM_RUN that enters nothing but completes the exit just
			// served (an OUT's RIP advance), so the parked state is whole.
			t.vcpu.RequestImmediateExit(true)
		}
		v.stats.runs.Add(1)
		if err := t.vcpu.Run(); err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				v.stats.intr.Add(1)
				if v.pause.request.Load() {
					v.park(t)
				}
				continue // kicked, or a stray signal: the loop condition decides
			}
			v.RequestExit(Exit{Kind: ExitError, VCPU: t.index, Err: fmt.Errorf("KVM_RUN: %w", err)})
			return
		}
		if e, end := v.handleExit(t); end {
			v.RequestExit(e)
			return
		}
	}
}

// loggedCounters are the KVM counters logCounters reports: every exit, the
// exits userspace sees, and those it does not (host interrupts, interrupt
// windows, nested page faults, emulated instructions).
var loggedCounters = []string{"exits", "io_exits", "mmio_exits", "halt_exits", "irq_exits",
	"irq_window_exits", "irq_injections", "insn_emulation", "pf_taken", "signal_exits"}

// logCounters logs, at debug level, what vCPU t's guest cost in exits
// over its life (KVM's counters, kvm.VCPU.Counters).
func (v *VM) logCounters(t *vcpuThread) {
	if !v.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	counters, err := t.vcpu.Counters()
	if err != nil {
		v.log.Debug("vmm: no KVM counters for the vCPU", "vcpu", t.index, "err", err)
		return
	}
	attrs := []any{"vcpu", t.index}
	for _, name := range loggedCounters {
		if n, ok := counters[name]; ok {
			attrs = append(attrs, name, n)
		}
	}
	v.log.Debug("vmm: the vCPU's exits (KVM's counters)", attrs...)
}

// handleExit serves one exit. It returns end=true with the reason when the
// exit ends the VM.
func (v *VM) handleExit(t *vcpuThread) (Exit, bool) {
	c := t.vcpu
	switch reason := c.ExitReason(); reason {
	case kvm.ExitIO:
		v.stats.io.Add(1)
		io, err := c.IO()
		if err != nil {
			return Exit{Kind: ExitError, VCPU: t.index, Err: err}, true
		}
		// String I/O (rep ins/outs) arrives as Count accesses of Size bytes
		// laid out one after the other; each is a separate device access.
		for i := 0; i < io.Count; i++ {
			chunk := io.Data[i*io.Size : (i+1)*io.Size]
			if io.Out {
				v.pio.Write(uint64(io.Port), chunk)
			} else {
				v.pio.Read(uint64(io.Port), chunk)
			}
		}
	case kvm.ExitMMIO:
		v.stats.mmio.Add(1)
		m, err := c.MMIO()
		if err != nil {
			return Exit{Kind: ExitError, VCPU: t.index, Err: err}, true
		}
		if m.Write {
			v.mmio.Write(m.Addr, m.Data)
		} else {
			v.mmio.Read(m.Addr, m.Data)
		}
	case kvm.ExitIntr, kvm.ExitIRQWindowOpen, kvm.ExitNMI:
		// Nothing to do; the loop re-enters unless the VM is ending.
	case kvm.ExitHLT:
		return Exit{Kind: ExitHalted, VCPU: t.index, Detail: v.dumpState(c)}, true
	case kvm.ExitShutdown:
		detail := "the guest CPU shut down (triple fault)\n"
		if r, err := c.GetRegs(); err == nil && r.RIP == 0xfff0 {
			// KVM on AMD reinitialises the VMCB on shutdown, so the
			// state below is the reset state, not the faulting one.
			detail += "(registers show the reset state: on AMD, KVM resets the vCPU on shutdown)\n"
		}
		return Exit{Kind: ExitTripleFault, VCPU: t.index, Detail: detail + v.dumpState(c)}, true
	case kvm.ExitFailEntry:
		hw, cpu := c.FailEntry()
		return Exit{Kind: ExitFailEntry, VCPU: t.index,
			Detail: fmt.Sprintf("KVM: entry failed, hardware error %#x (on host CPU %d)\n%s", hw, cpu, v.dumpState(c))}, true
	case kvm.ExitInternalError:
		ie := c.Internal()
		return Exit{Kind: ExitInternalError, VCPU: t.index, Detail: formatInternalError(ie, v.dumpState(c))}, true
	case kvm.ExitSystemEvent:
		switch ev := c.SystemEvent(); ev {
		case kvm.SystemEventShutdown:
			return Exit{Kind: ExitPowerOff, VCPU: t.index}, true
		case kvm.SystemEventReset:
			return Exit{Kind: ExitReset, VCPU: t.index}, true
		case kvm.SystemEventCrash:
			return Exit{Kind: ExitCrash, VCPU: t.index, Detail: v.dumpState(c)}, true
		default:
			return Exit{Kind: ExitError, VCPU: t.index, Err: fmt.Errorf("unknown KVM system event %d", ev)}, true
		}
	default:
		return Exit{Kind: ExitError, VCPU: t.index,
			Err: fmt.Errorf("unhandled exit %s", reason), Detail: v.dumpState(c)}, true
	}
	return Exit{}, false
}
