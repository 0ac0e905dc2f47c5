package machine

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/devices/platform"
	"github.com/cowork-vmm/cowork-vmm/devices/serial"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/loader"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// virtioGSIs are the interrupt lines handed to virtio-mmio devices, in
// order: ISA lines no legacy device of a PC claims (0 PIT, 1 keyboard, 2
// cascade, 3/4 COM2/COM1, 8 RTC, 13 FPU are skipped), then the IOAPIC-only
// pins 16..23. The MP table routes every line to its IOAPIC pin, edge
// triggered, which is what an irqfd delivers.
var virtioGSIs = []uint32{5, 6, 7, 9, 10, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}

// addPlatformDevices registers the PC's platform devices on port I/O: the
// 8250 console at COM1 (0x3f8, IRQ 4), the i8042 whose reset command ends
// the VM, and the snapshot point when there is one.
func (m *Machine) addPlatformDevices() error {
	vm, cfg := m.vm, m.cfg
	irq, err := vm.IRQLine(serial.COM1IRQ)
	if err != nil {
		return err
	}
	m.uart = serial.New(cfg.Console, irq)
	if err := vm.PIO().Register(serial.COM1Port, serial.PortCount, m.uart); err != nil {
		return err
	}
	i8042 := platform.NewI8042(func() {
		vm.RequestExit(vmm.Exit{Kind: vmm.ExitReset, VCPU: -1, Detail: "the guest reset the machine through the i8042"})
	})
	if err := vm.PIO().Register(platform.I8042Port, platform.I8042PortCount, i8042); err != nil {
		return err
	}
	if cfg.SnapshotPoint != nil {
		if err := vm.PIO().Register(guesthost.SnapshotPointPort, platform.SnapshotPointPortCount, cfg.SnapshotPoint); err != nil {
			return err
		}
	}
	return nil
}

// virtioSlot is where the n-th virtio-mmio transport goes: the n-th 4 KiB
// window of the MMIO hole (from x86.VirtioMMIOBase) and the n-th free
// interrupt line; ok is false when none is left.
func virtioSlot(n int) (base uint64, gsi uint32, ok bool) {
	if n >= len(virtioGSIs) || n >= x86.VirtioMMIOMaxDevices {
		return 0, 0, false
	}
	return x86.VirtioMMIOBase + uint64(n)*x86.VirtioMMIOSize, virtioGSIs[n], true
}

// virtioCmdline announces each transport on the kernel command line
// (virtio_mmio.device=): a PC has no device tree.
func virtioCmdline(places []virtioPlace) []string {
	entries := make([]string, len(places))
	for i, p := range places {
		entries[i] = virtio.MMIOCmdline(p.base, p.gsi)
	}
	return entries
}

// loadKernel writes the kernel, initrd, command line and boot tables (zero
// page or PVH start info, MP table, e820, GDT, page tables) into guest
// memory and sets the boot vCPU's registers.
func (m *Machine) loadKernel(images bootImages, cmdline string) error {
	setup, err := loader.PrepareBoot(m.vm.Memory(), loader.BootConfig{
		MemBytes:     uint64(m.cfg.MemMiB) << 20,
		CPUs:         m.cfg.CPUs,
		Kernel:       images.kernel,
		InitrdSource: images.initrd,
		Cmdline:      cmdline,
		PVH:          m.cfg.PVH,
	})
	if err != nil {
		return fmt.Errorf("machine: loading the kernel: %w", err)
	}
	if err := m.vm.SetBootRegisters(0, setup.Regs, setup.SRegs); err != nil {
		return err
	}
	m.log.Debug("kernel loaded", "format", setup.Kernel.Format, "entry", fmt.Sprintf("%#x", setup.Regs.RIP),
		"initrd_addr", fmt.Sprintf("%#x", setup.InitrdAddr), "cmdline", cmdline)
	return nil
}

// registerBootTimer puts the boot timer at its I/O port.
func (m *Machine) registerBootTimer() error {
	return m.vm.PIO().Register(guesthost.BootTimerPort, platform.BootTimerPortCount, m.bootTimer)
}
