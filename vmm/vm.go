package vmm

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// Config describes a VM to create.
type Config struct {
	// MemoryBytes of guest RAM (a multiple of 4 KiB).
	MemoryBytes uint64
	// CPUs is the number of vCPUs (1..MaxVCPUs). vCPU 0 is the bootstrap
	// processor; the others wait for INIT/SIPI from it.
	CPUs int
	// MMIOHoleStart is where RAM stops below 4 GiB; 0 means
	// DefaultMMIOHoleStart.
	MMIOHoleStart uint64
	// CPUID builds each vCPU's CPUID table. nil means LinuxCPUID.
	CPUID CPUIDPolicy
	// Logger receives the VMM's log; nil means slog.Default().
	Logger *slog.Logger
	// DevicePath of KVM; empty means /dev/kvm.
	DevicePath string
	// MemoryImage, when set, is guest RAM to start from, mapped
	// copy-on-write from a file (RestoreSnapshot sets it); nil: zeroed RAM.
	MemoryImage *MemoryImage
}

// VM is a KVM virtual machine with guest memory, buses and vCPUs. Create it
// with New, set up the boot vCPU's registers and load the guest into
// Memory, register devices on PIO and MMIO, then Start. Wait returns why it
// ended; Stop (or Close) releases everything.
type VM struct {
	log  *slog.Logger
	sys  *kvm.System
	kvm  *kvm.VM
	mem  *Memory
	pio  *Bus
	mmio *Bus
	pvm  bool
	// arch is what the architecture adds to a VM (arm64: the GIC device).
	arch archVM

	vcpus []*vcpuThread
	// kvmStats are the vCPUs' KVM statistics, opened before they run (Exits);
	// nil where the kernel has none.
	kvmStats []*kvm.Stats

	irqMu sync.Mutex
	irqs  []*irqfdLine

	ioEventState

	exitRequested atomic.Bool
	ending        chan struct{} // closed with exitRequested's first store
	pause         pauser
	stats         vmStats

	mu      sync.Mutex // guards the fields below
	started bool
	closed  bool
	exit    Exit
	done    chan struct{} // closed when every vCPU thread has returned
	wg      sync.WaitGroup
}

// New opens KVM and creates a VM as described by cfg: in-kernel irqchip
// (PIC, IOAPIC, LAPICs) and PIT, guest memory split around the MMIO hole,
// and cfg.CPUs vCPUs with their CPUID set and their LAPIC LINT0 wired to
// ExtINT and LINT1 to NMI. On error everything created is released.
func New(cfg Config) (_ *VM, err error) {
	hole, err := cfg.check()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	policy := cfg.CPUID
	if policy == nil {
		policy = LinuxCPUID
	}

	v := &VM{log: log, pio: NewPIOBus(log), mmio: NewMMIOBus(log), done: make(chan struct{}), ending: make(chan struct{})}
	v.pause.parked = make(chan struct{}, cfg.CPUs)
	defer func() {
		if err != nil {
			v.release()
		}
	}()
	if err = v.openKVM(cfg.DevicePath, cfg.CPUs); err != nil {
		return nil, err
	}
	if err = v.createVM(); err != nil {
		return nil, err
	}
	if err = v.mapMemory(cfg.MemoryBytes, hole, cfg.MemoryImage); err != nil {
		return nil, err
	}
	if err = v.createVCPUs(cfg.CPUs, policy); err != nil {
		return nil, err
	}
	if err = v.finishVM(); err != nil {
		return nil, err
	}
	return v, nil
}

// check validates cfg's sizes and returns where the MMIO hole starts.
func (cfg Config) check() (hole uint64, err error) {
	if cfg.CPUs < 1 || cfg.CPUs > MaxVCPUs {
		return 0, fmt.Errorf("vmm: %d vCPUs requested, must be 1..%d", cfg.CPUs, MaxVCPUs)
	}
	if cfg.MemoryBytes == 0 || cfg.MemoryBytes%pageSize != 0 || cfg.MemoryBytes > MaxGuestMemory {
		return 0, fmt.Errorf("vmm: memory size %d must be a non-zero multiple of 4 KiB, at most %d", cfg.MemoryBytes, MaxGuestMemory)
	}
	return cfg.mmioHole()
}

// openKVM opens the KVM device at path (empty: kvm.DevicePath), looks at
// the host as its architecture needs (checkHost) and refuses more vCPUs
// than this KVM allows.
func (v *VM) openKVM(path string, cpus int) error {
	if path == "" {
		path = kvm.DevicePath
	}
	var err error
	if v.sys, err = kvm.OpenPath(path); err != nil {
		return err
	}
	v.checkHost()
	if n, cerr := v.sys.CheckExtension(kvm.CapMaxVCPUs); cerr == nil && n > 0 && cpus > n {
		return fmt.Errorf("vmm: %d vCPUs requested, this KVM allows %d", cpus, n)
	}
	return nil
}

// mapMemory makes the guest's RAM (zeroed, or image's copy-on-write),
// split around the MMIO hole, and registers each region with KVM.
func (v *VM) mapMemory(size, hole uint64, image *MemoryImage) error {
	var err error
	if image != nil {
		v.mem, err = NewMemoryFromImage(ramLayout(size, hole), *image)
	} else {
		v.mem, err = NewMemory(ramLayout(size, hole))
	}
	if err != nil {
		return err
	}
	for slot, r := range v.mem.regions {
		if err := v.kvm.SetUserMemoryRegion(kvm.UserspaceMemoryRegion{
			Slot: uint32(slot), GuestPhysAddr: r.GPA, MemorySize: r.Size, UserspaceAddr: hostAddress(r.host),
		}); err != nil {
			return err
		}
	}
	return nil
}

// Stats counts what the vCPUs did, for diagnostics and benchmarks.
type Stats struct {
	Runs        uint64 // KVM_RUN calls
	IOExits     uint64 // port I/O exits (a string I/O exit counts once)
	MMIOExits   uint64
	Interrupted uint64 // KVM_RUN returned EINTR (kicks, stray signals)
}

type vmStats struct {
	runs, io, mmio, intr atomic.Uint64
}

// Stats returns the counters so far.
func (v *VM) Stats() Stats {
	return Stats{Runs: v.stats.runs.Load(), IOExits: v.stats.io.Load(),
		MMIOExits: v.stats.mmio.Load(), Interrupted: v.stats.intr.Load()}
}

// DumpVCPU renders vCPU i's registers and the code at RIP, qemu style. The
// vCPU must not be running (before Start or after Wait): KVM serialises
// register access with KVM_RUN.
func (v *VM) DumpVCPU(i int) string {
	c := v.VCPU(i)
	if c == nil {
		return fmt.Sprintf("no vCPU %d", i)
	}
	return v.dumpState(c)
}

// Memory returns guest RAM.
func (v *VM) Memory() *Memory { return v.mem }

// PIO returns the port-I/O bus.
func (v *VM) PIO() *Bus { return v.pio }

// MMIO returns the MMIO bus.
func (v *VM) MMIO() *Bus { return v.mmio }

// NumVCPUs returns the number of vCPUs.
func (v *VM) NumVCPUs() int { return len(v.vcpus) }

// VCPU returns vCPU i, to set its registers, special registers and MSRs
// before Start. Do not call its Run: the VM's threads do.
func (v *VM) VCPU(i int) *kvm.VCPU {
	if i < 0 || i >= len(v.vcpus) {
		return nil
	}
	return v.vcpus[i].vcpu
}

// KVM returns the VM's KVM handle, for ioctls this package does not wrap
// (e.g. IOEVENTFD registrations).
func (v *VM) KVM() *kvm.VM { return v.kvm }

// IsPVM reports whether the host KVM is PVM, on which a stock Linux guest
// cannot boot (see HOST-FACTS): callers should say so rather than hang.
func (v *VM) IsPVM() bool { return v.pvm }

// IRQLine returns an edge-triggered interrupt line on GSI gsi of the
// in-kernel irqchip (IOAPIC pins 0-23; 0-15 also reach the PICs), backed by
// an irqfd. It stays valid until Close; afterwards Trigger returns
// ErrIRQClosed.
func (v *VM) IRQLine(gsi uint32) (IRQLine, error) {
	v.mu.Lock()
	closed := v.closed
	v.mu.Unlock()
	if closed {
		return nil, ErrIRQClosed
	}
	l, err := newIRQFDLine(v.kvm, gsi)
	if err != nil {
		return nil, err
	}
	v.irqMu.Lock()
	v.irqs = append(v.irqs, l)
	v.irqMu.Unlock()
	return l, nil
}

// LevelIRQLine returns a level-triggered line on GSI gsi (KVM_IRQ_LINE).
func (v *VM) LevelIRQLine(gsi uint32) *LevelIRQLine {
	return &LevelIRQLine{gsi: gsi, vm: v}
}

func (v *VM) irqLine(gsi uint32, high bool) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return ErrIRQClosed
	}
	return v.kvm.IRQLine(irqLineNumber(gsi), high)
}

// Start launches one OS thread per vCPU running KVM_RUN. It may be called once.
func (v *VM) Start() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return errors.New("vmm: Start after Close")
	}
	if v.started {
		return errors.New("vmm: VM already started")
	}
	v.started = true
	v.wg.Add(len(v.vcpus))
	for _, t := range v.vcpus {
		go v.runVCPU(t)
	}
	go func() {
		v.wg.Wait()
		close(v.done)
	}()
	return nil
}

// RequestExit ends the VM with reason e, unless it is already ending (the
// first reason wins). Every vCPU is kicked out of KVM_RUN. Safe from any
// goroutine, including a device called on a vCPU thread (e.g. a reset port).
// It does not wait: Wait does.
func (v *VM) RequestExit(e Exit) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed || v.exitRequested.Load() {
		return
	}
	v.exit = e
	v.exitRequested.Store(true)
	close(v.ending)
	v.kickAllLocked()
	if v.started {
		go v.rekick()
	}
}

// kickAllLocked kicks every vCPU; v.mu is held and the VM is not closed.
func (v *VM) kickAllLocked() {
	for _, t := range v.vcpus {
		t.kick()
	}
}

// rekick repeats the kick until every vCPU thread has returned. One kick
// suffices by construction (immediate_exit is set before the signal); the
// repeat is a cheap guard against a signal lost to something outside this
// package, e.g. a program that ignores the kick's signal with os/signal.
func (v *VM) rekick() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-v.done:
			return
		case <-t.C:
			v.mu.Lock()
			if !v.closed {
				v.kickAllLocked()
			}
			v.mu.Unlock()
		}
	}
}

// Done is closed when every vCPU thread has returned (after Start).
func (v *VM) Done() <-chan struct{} { return v.done }

// Wait blocks until the VM has ended and every vCPU thread has returned,
// and says why it ended. It does not release resources: call Close (or use
// Stop) once devices that use guest memory are stopped.
func (v *VM) Wait() Exit {
	v.mu.Lock()
	started := v.started
	v.mu.Unlock()
	if !started {
		return Exit{Kind: ExitError, VCPU: -1, Err: errors.New("VM never started")}
	}
	<-v.done
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.exit
}

// Stop ends the VM (if still running), joins its vCPU threads, and releases
// everything (Close). It returns why the VM ended: ExitStopped unless the
// guest had already ended it.
func (v *VM) Stop() (Exit, error) {
	v.RequestExit(Exit{Kind: ExitStopped, VCPU: -1})
	e := v.Wait()
	if !v.isStarted() {
		e = Exit{Kind: ExitStopped, VCPU: -1}
	}
	return e, v.Close()
}

func (v *VM) isStarted() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.started
}

// Close stops the VM if it is running, waits for its vCPU threads, then
// closes every interrupt line, vCPU, the VM and /dev/kvm, and unmaps guest
// memory. Idempotent. Devices must have stopped touching guest memory: a
// Memory access after Close fails with ErrMemoryClosed.
func (v *VM) Close() error {
	v.RequestExit(Exit{Kind: ExitStopped, VCPU: -1})
	if v.isStarted() {
		<-v.done
	}
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	v.closed = true
	v.mu.Unlock()
	return v.release()
}

// release frees every resource New created, in reverse order.
func (v *VM) release() error {
	var errs []error
	if err := v.CloseIOEvents(); err != nil {
		errs = append(errs, err)
	}
	v.irqMu.Lock()
	for _, l := range v.irqs {
		if err := l.close(); err != nil {
			errs = append(errs, err)
		}
	}
	v.irqs = nil
	v.irqMu.Unlock()
	closeStats(v.kvmStats)
	for _, t := range v.vcpus {
		if err := t.vcpu.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := v.arch.close(); err != nil {
		errs = append(errs, err)
	}
	if v.kvm != nil {
		if err := v.kvm.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if v.mem != nil {
		if err := v.mem.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if v.sys != nil {
		if err := v.sys.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
