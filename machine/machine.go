package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/platform"
	"github.com/cowork-vmm/cowork-vmm/devices/serial"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// virtioPlace is where a virtio-mmio transport sits: its window's base
// and its interrupt line.
type virtioPlace struct {
	base uint64
	gsi  uint32
}

// Machine is one micro-VM. New assembles it, AddVirtioMMIO attaches
// devices, Start loads the kernel and runs it, Wait and Stop end it.
type Machine struct {
	cfg  Config
	log  *slog.Logger
	vm   *vmm.VM
	uart *serial.UART

	images bootImages // empty for machines that run hand-made guests (tests)

	mu        sync.Mutex
	started   bool
	stopped   bool
	restoring *snapshot.File // the snapshot StartRestored goes on from
	virtio    []*virtio.MMIO
	virtioAt  []virtioPlace // where each of virtio sits
	bootTimer *platform.BootTimer
	exit      vmm.Exit
}

// New creates the VM (memory, vCPUs, in-kernel irqchip and PIT) and its
// platform devices: the 8250 console at COM1 (0x3f8, IRQ 4), the i8042 at
// 0x60–0x64 whose reset command ends the VM, and the boot timer at
// 0x3f0 (armed by Start). It reads the kernel and initrd; they are loaded
// into guest memory by Start. On a host whose KVM cannot boot Linux it
// returns an error wrapping kvm.ErrCannotBootLinux, unless
// cfg.SkipBootProbe.
func New(cfg Config) (*Machine, error) {
	images, err := cfg.images()
	if err != nil {
		return nil, err
	}
	m, err := assemble(cfg)
	if err != nil {
		images.release()
		return nil, err
	}
	m.images = images
	return m, nil
}

// assemble builds the VM and platform devices without a kernel.
func assemble(cfg Config) (*Machine, error) {
	return assembleWith(cfg, vmm.New)
}

// assembleWith is assemble with the VM made by newVM (vmm.New, or a
// restore from a snapshot).
func assembleWith(cfg Config, newVM func(vmm.Config) (*vmm.VM, error)) (_ *Machine, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	if !cfg.SkipBootProbe {
		if err := kvm.ProbeHost(cfg.KVMDevice).BootsLinux(); err != nil {
			return nil, fmt.Errorf("%w; use a host with hardware virtualisation (VT-x/AMD-V, or nested virtualisation enabled)", err)
		}
	}
	vm, err := newVM(cfg.vmConfig())
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			vm.Close()
		}
	}()
	m := &Machine{cfg: cfg, log: cfg.Logger, vm: vm}

	if err := m.addPlatformDevices(); err != nil {
		return nil, err
	}
	return m, nil
}

// VM returns the underlying VM (its buses, memory and vCPUs), for tests
// and for devices this package does not place.
func (m *Machine) VM() *vmm.VM { return m.vm }

// AddVirtioMMIO attaches dev behind a virtio-mmio transport in the next
// 4 KiB window of the MMIO hole (from x86.VirtioMMIOBase) with the next
// free interrupt line, and announces it on the kernel command line. Call
// it before Start. It returns the transport (the machine resets it on Stop).
func (m *Machine) AddVirtioMMIO(dev virtio.Device) (*virtio.MMIO, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started {
		return nil, errors.New("machine: AddVirtioMMIO after Start: the guest would not learn of the device")
	}
	n := len(m.virtio)
	base, gsi, ok := virtioSlot(n)
	if !ok {
		return nil, fmt.Errorf("machine: no interrupt line left for virtio device %d", n)
	}
	irq, err := m.vm.IRQLine(gsi)
	if err != nil {
		return nil, err
	}
	t := virtio.NewMMIO(dev, m.vm.Memory(), irq, virtio.MMIOOptions{Logger: m.log})
	if err := m.vm.MMIO().Register(base, virtio.MMIOSize, t); err != nil {
		return nil, err
	}
	m.virtio = append(m.virtio, t)
	m.virtioAt = append(m.virtioAt, virtioPlace{base: base, gsi: gsi})
	m.notifyByEventFD(t, base, len(dev.QueueMaxSizes()))
	m.absorbAcks(t, base)
	return t, nil
}

// absorbAcks has KVM absorb the driver's interrupt acknowledgements of the
// transport at base: its status read already acknowledged them
// (virtio.AckValues), and each one would otherwise be a second exit per
// interrupt, beside that read. Where KVM cannot, the write stays an exit.
func (m *Machine) absorbAcks(t *virtio.MMIO, base uint64) {
	for _, v := range virtio.AckValues() {
		if err := m.vm.AbsorbMMIOWrite(base+virtio.MMIOInterruptACK, 4, uint64(v)); err != nil {
			m.log.Debug("machine: interrupt acknowledgement stays an MMIO exit", "device", t.Device().Type(), "err", err)
			return
		}
	}
}

// notifyByEventFD has KVM turn the driver's notify of each of the n queues
// of the transport at base into an eventfd signal (vmm.OnMMIOWrite), so a
// notify costs no exit to us. Where KVM cannot, the notify stays an MMIO
// exit, which works the same, slower.
func (m *Machine) notifyByEventFD(t *virtio.MMIO, base uint64, n int) {
	for q := range n {
		index := uint32(q)
		err := m.vm.OnMMIOWrite(base+virtio.MMIOQueueNotify, 4, uint64(index), func() { t.NotifyQueue(index) })
		if err != nil {
			m.log.Debug("machine: virtqueue notify stays an MMIO exit", "device", t.Device().Type(), "queue", q, "err", err)
			return
		}
	}
}

// Cmdline returns the kernel command line Start passes: the configured one
// and an entry per virtio-mmio device.
func (m *Machine) Cmdline() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.TrimSpace(strings.Join(append([]string{m.cfg.baseCmdline()}, virtioCmdline(m.virtioAt)...), " "))
}

// Start loads the kernel, initrd, command line and boot tables (zero page or
// PVH start info, MP table, e820, GDT, page tables) into guest memory, sets
// the boot vCPU's registers, arms the boot timer and runs the vCPUs.
func (m *Machine) Start() error {
	cmdline := m.Cmdline()
	m.mu.Lock()
	images := m.images // Start owns them now: a concurrent Stop does not unmap them under us
	m.images = bootImages{}
	m.mu.Unlock()
	defer images.release() // in guest memory once loaded, or never to be
	if images.kernel != nil {
		if err := m.loadKernel(images, cmdline); err != nil {
			return err
		}
	}
	return m.startVCPUs()
}

// startVCPUs arms the boot timer and starts the VM.
func (m *Machine) startVCPUs() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started {
		return errors.New("machine: already started")
	}
	if m.stopped {
		return errors.New("machine: Start after Stop")
	}
	m.bootTimer = platform.NewBootTimer(time.Now(), func(d time.Duration) {
		m.log.Info("guest reported boot", "boot_time", d)
	})
	if err := m.registerBootTimer(); err != nil {
		return err
	}
	if err := m.vm.Start(); err != nil {
		return err
	}
	m.started = true
	return nil
}

// BootTime returns the time from Start to the guest's boot-timer write,
// and false until the guest has written it.
func (m *Machine) BootTime() (time.Duration, bool) {
	m.mu.Lock()
	t := m.bootTimer
	m.mu.Unlock()
	if t == nil {
		return 0, false
	}
	return t.Elapsed()
}

// BootTimerDone is closed when the guest writes the boot timer; nil before Start.
func (m *Machine) BootTimerDone() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bootTimer == nil {
		return nil
	}
	return m.bootTimer.Done()
}

// Done is closed when the VM has ended (every vCPU thread returned).
func (m *Machine) Done() <-chan struct{} { return m.vm.Done() }

// Wait blocks until the VM ends and returns why. The console is flushed.
// Resources stay allocated until Stop.
func (m *Machine) Wait() vmm.Exit {
	e := m.vm.Wait()
	if err := m.uart.Flush(); err != nil {
		m.log.Warn("console output failed", "err", err)
	}
	return e
}

// Stop ends the VM if it still runs, waits for its vCPUs, resets every
// virtio device (so their goroutines stop touching guest memory), flushes
// the console and releases the VM. It returns why the VM ended
// (vmm.ExitStopped when Stop ended it). Idempotent.
func (m *Machine) Stop() (vmm.Exit, error) {
	m.mu.Lock()
	if m.stopped {
		e := m.exit
		m.mu.Unlock()
		return e, nil
	}
	m.stopped = true
	m.images.release()
	started := m.started
	transports := m.virtio
	m.mu.Unlock()

	e := vmm.Exit{Kind: vmm.ExitStopped, VCPU: -1}
	if started {
		m.vm.RequestExit(vmm.Exit{Kind: vmm.ExitStopped, VCPU: -1, Detail: "stopped by the host"})
		e = m.vm.Wait()
	}
	// No notify handler may run into a transport being reset.
	if err := m.vm.CloseIOEvents(); err != nil {
		m.log.Warn("machine: closing the virtqueue notify eventfds", "err", err)
	}
	for _, t := range transports {
		t.Reset()
	}
	var errs []error
	if err := m.uart.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("console output: %w", err))
	}
	if err := m.vm.Close(); err != nil {
		errs = append(errs, err)
	}
	m.mu.Lock()
	m.exit = e
	m.mu.Unlock()
	return e, errors.Join(errs...)
}

// RunKernel boots cfg's kernel and runs it until the guest ends the VM
// (reset, power-off, crash, triple fault, KVM error) or ctx is cancelled,
// then stops the machine. The Exit says why it ended; the error is non-nil
// when the machine could not be set up or released, or the VM ended
// abnormally (not a stop, reset or power-off) — it then carries the exit's
// report (registers, code bytes) for the user.
func RunKernel(ctx context.Context, cfg Config) (vmm.Exit, error) {
	m, err := New(cfg)
	if err != nil {
		return vmm.Exit{}, err
	}
	if err := m.Start(); err != nil {
		_, stopErr := m.Stop()
		return vmm.Exit{}, errors.Join(err, stopErr)
	}
	select {
	case <-ctx.Done():
	case <-m.Done():
	}
	e, err := m.Stop()
	if err != nil {
		return e, err
	}
	return e, e.AsError()
}

// InjectConsoleInput queues p as input on the serial console (what a user
// types); it returns how many bytes fit in the UART's bounded buffer.
func (m *Machine) InjectConsoleInput(p []byte) int { return m.uart.Inject(p) }
