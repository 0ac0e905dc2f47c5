package machine

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/devices/platform"
	"github.com/cowork-vmm/cowork-vmm/devices/serial"
	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
)

// addPlatformDevices registers the arm64 machine's platform devices on
// MMIO: the 16550 console at arm64.UARTBase on its SPI, and the snapshot
// point's page when there is one. There is no reset controller: PSCI's
// SYSTEM_RESET and SYSTEM_OFF, which KVM serves, end the VM.
func (m *Machine) addPlatformDevices() error {
	irq, err := m.vm.IRQLine(arm64.UARTSPI)
	if err != nil {
		return err
	}
	m.uart = serial.New(m.cfg.Console, irq)
	if err := m.vm.MMIO().Register(arm64.UARTBase, serial.PortCount, m.uart); err != nil {
		return err
	}
	if m.cfg.SnapshotPoint != nil {
		if err := m.vm.MMIO().Register(arm64.SnapshotPointBase, platform.SnapshotPointPortCount, m.cfg.SnapshotPoint); err != nil {
			return err
		}
	}
	return nil
}

// virtioSlot is where the n-th virtio-mmio transport goes: the n-th window
// from arm64.VirtioMMIOBase, on the n-th SPI from arm64.FirstVirtioSPI; ok
// is false when none is left.
func virtioSlot(n int) (base uint64, gsi uint32, ok bool) {
	if n < 0 || n >= arm64.VirtioMMIOMaxDevices {
		return 0, 0, false
	}
	d := arm64.VirtioDevice(n)
	return d.Base, d.SPI, true
}

// virtioCmdline is empty on arm64: the device tree announces the
// transports (loadKernel), each with its interrupt in the GIC's numbering,
// which a virtio_mmio.device= entry could not give.
func virtioCmdline([]virtioPlace) []string { return nil }

// loadKernel writes the Image, the initrd and the device tree (memory,
// vCPUs, the VM's GIC, timer, PSCI, console, every virtio transport, the
// command line) into guest memory and points the boot vCPU at the Image
// with x0 at the device tree.
func (m *Machine) loadKernel(images bootImages, cmdline string) error {
	devices := make([]arm64.MMIODevice, len(m.virtioAt))
	for i, p := range m.virtioAt {
		devices[i] = arm64.MMIODevice{Base: p.base, SPI: p.gsi}
	}
	setup, err := arm64.PrepareBoot(m.vm.Memory(), arm64.BootConfig{
		MemBytes:     uint64(m.cfg.MemMiB) << 20,
		CPUs:         m.cfg.CPUs,
		GIC:          m.vm.GIC(),
		Kernel:       images.kernel,
		InitrdSource: images.initrd,
		Cmdline:      cmdline,
		Virtio:       devices,
	})
	if err != nil {
		return fmt.Errorf("machine: loading the kernel: %w", err)
	}
	if err := m.vm.SetBootEntry(0, setup.KernelEntry, setup.DTBAddr); err != nil {
		return err
	}
	m.log.Debug("kernel loaded", "entry", fmt.Sprintf("%#x", setup.KernelEntry), "dtb", fmt.Sprintf("%#x", setup.DTBAddr),
		"initrd_addr", fmt.Sprintf("%#x", setup.InitrdAddr), "cmdline", cmdline)
	return nil
}

// registerBootTimer puts the boot timer in its MMIO page.
func (m *Machine) registerBootTimer() error {
	return m.vm.MMIO().Register(arm64.BootTimerBase, platform.BootTimerPortCount, m.bootTimer)
}
