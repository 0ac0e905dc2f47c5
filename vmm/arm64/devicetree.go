package arm64

import (
	"errors"
	"fmt"
	"strings"
)

// CmdlineMaxSize bounds the kernel command line including its NUL: arm64
// Linux's COMMAND_LINE_SIZE.
const CmdlineMaxSize = 2048

// GIC interrupt specifier cells (the arm,gic-v3 and arm,gic bindings:
// type, number, flags) and the phandle of the one interrupt controller.
const (
	gicSPI            uint32 = 0
	gicPPI            uint32 = 1
	irqEdgeRising     uint32 = 1
	irqLevelLow       uint32 = 8
	gicPhandle        uint32 = 1
	timerInterruptLen        = 4
	// gicV2PPICPUMaskShift places a GICv2 PPI's CPU mask in its flags.
	gicV2PPICPUMaskShift = 8
)

// uartNodeName is the console's node, also its path below the root.
func uartNodeName() string { return fmt.Sprintf("serial@%x", UARTBase) }

// DeviceTreeConfig is the machine DeviceTree describes.
type DeviceTreeConfig struct {
	// CPUs is the vCPU count, 1..MaxCPUs (MaxCPUsGICv2 with a GICv2).
	CPUs int
	// GIC is the interrupt controller the VM has (the zero value GICv3).
	GIC GIC
	// MemBytes is the guest RAM size (see CheckMemorySize), from RAMBase.
	MemBytes uint64
	// Cmdline is the kernel command line (/chosen/bootargs), shorter than
	// CmdlineMaxSize.
	Cmdline string
	// InitrdStart and InitrdEnd are the initrd's guest physical range
	// [start, end); both 0 for none.
	InitrdStart, InitrdEnd uint64
	// Virtio are the virtio-mmio devices, each a distinct window in the
	// virtio-mmio area with a distinct SPI from FirstVirtioSPI upward.
	Virtio []MMIODevice
}

// ErrBadDeviceTreeConfig is returned for a DeviceTreeConfig that does not
// describe a machine of this layout.
var ErrBadDeviceTreeConfig = errors.New("bad device tree configuration")

// DeviceTree returns the DTB describing the machine: RAM, the vCPUs (PSCI
// 0.2 over HVC), the GIC, the architected timer, the 16550 console and
// the virtio-mmio devices, with the command line and the initrd in /chosen.
// The boot timer and snapshot point pages are left out: only our agent
// knows them.
func DeviceTree(cfg DeviceTreeConfig) ([]byte, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	w := newFDTWriter()
	w.BeginNode("")
	w.PropertyCells("#address-cells", 2)
	w.PropertyCells("#size-cells", 2)
	w.PropertyString("compatible", "linux,dummy-virt")
	w.PropertyCells("interrupt-parent", gicPhandle)
	writeChosen(w, cfg)
	w.BeginNode("aliases")
	w.PropertyString("serial0", "/"+uartNodeName())
	w.EndNode()
	w.BeginNode(fmt.Sprintf("memory@%x", RAMBase))
	w.PropertyString("device_type", "memory")
	w.PropertyU64("reg", RAMBase, cfg.MemBytes)
	w.EndNode()
	writeCPUs(w, cfg.CPUs)
	w.BeginNode("psci")
	w.PropertyString("compatible", "arm,psci-0.2")
	w.PropertyString("method", "hvc")
	w.EndNode()
	writeGIC(w, cfg.GIC, cfg.CPUs)
	writeTimer(w, cfg.GIC, cfg.CPUs)
	writeUART(w)
	for _, d := range cfg.Virtio {
		w.BeginNode(fmt.Sprintf("virtio_mmio@%x", d.Base))
		w.PropertyString("compatible", "virtio,mmio")
		w.PropertyU64("reg", d.Base, VirtioMMIOSize)
		w.PropertyCells("interrupts", gicSPI, d.SPI, irqEdgeRising)
		w.PropertyEmpty("dma-coherent")
		w.EndNode()
	}
	w.EndNode()
	return w.Finish(uint32(MPIDR(0)))
}

// check validates the configuration against the layout.
func (cfg DeviceTreeConfig) check() error {
	maxCPUs := MaxCPUs
	switch cfg.GIC {
	case GICv3:
	case GICv2:
		maxCPUs = MaxCPUsGICv2
	default:
		return fmt.Errorf("%w: unknown GIC %d", ErrBadDeviceTreeConfig, cfg.GIC)
	}
	if cfg.CPUs < 1 || cfg.CPUs > maxCPUs {
		return fmt.Errorf("%w: %d vCPUs, want 1..%d with a %v", ErrBadDeviceTreeConfig, cfg.CPUs, maxCPUs, cfg.GIC)
	}
	if err := CheckMemorySize(cfg.MemBytes); err != nil {
		return err
	}
	if len(cfg.Cmdline) >= CmdlineMaxSize {
		return fmt.Errorf("%w: command line of %d bytes, the limit is %d", ErrBadDeviceTreeConfig, len(cfg.Cmdline), CmdlineMaxSize-1)
	}
	if strings.IndexByte(cfg.Cmdline, 0) >= 0 {
		return fmt.Errorf("%w: the command line holds a NUL byte", ErrBadDeviceTreeConfig)
	}
	if err := checkInitrdRange(cfg.InitrdStart, cfg.InitrdEnd, cfg.MemBytes); err != nil {
		return err
	}
	return checkVirtio(cfg.Virtio)
}

func checkInitrdRange(start, end, memBytes uint64) error {
	if start == 0 && end == 0 {
		return nil
	}
	if start < RAMBase || end <= start || end > RAMBase+memBytes {
		return fmt.Errorf("%w: initrd [%#x, %#x) is not a non-empty range inside RAM [%#x, %#x)", ErrBadDeviceTreeConfig, start, end, RAMBase, RAMBase+memBytes)
	}
	return nil
}

func checkVirtio(devices []MMIODevice) error {
	if len(devices) > VirtioMMIOMaxDevices {
		return fmt.Errorf("%w: %d virtio-mmio devices, at most %d", ErrBadDeviceTreeConfig, len(devices), VirtioMMIOMaxDevices)
	}
	const windowEnd = VirtioMMIOBase + VirtioMMIOMaxDevices*VirtioMMIOSize
	var bases, spis [VirtioMMIOMaxDevices]bool
	for _, d := range devices {
		if d.Base < VirtioMMIOBase || d.Base >= windowEnd || (d.Base-VirtioMMIOBase)%VirtioMMIOSize != 0 {
			return fmt.Errorf("%w: virtio-mmio device at %#x is not a window in [%#x, %#x)", ErrBadDeviceTreeConfig, d.Base, VirtioMMIOBase, windowEnd)
		}
		if d.SPI < FirstVirtioSPI || d.SPI >= FirstVirtioSPI+VirtioMMIOMaxDevices {
			return fmt.Errorf("%w: virtio-mmio device at %#x has SPI %d, want %d..%d", ErrBadDeviceTreeConfig, d.Base, d.SPI, FirstVirtioSPI, FirstVirtioSPI+VirtioMMIOMaxDevices-1)
		}
		b, s := (d.Base-VirtioMMIOBase)/VirtioMMIOSize, d.SPI-FirstVirtioSPI
		if bases[b] || spis[s] {
			return fmt.Errorf("%w: virtio-mmio device at %#x (SPI %d) shares its window or SPI with another", ErrBadDeviceTreeConfig, d.Base, d.SPI)
		}
		bases[b], spis[s] = true, true
	}
	return nil
}

func writeChosen(w *fdtWriter, cfg DeviceTreeConfig) {
	w.BeginNode("chosen")
	w.PropertyString("bootargs", cfg.Cmdline)
	w.PropertyString("stdout-path", "/"+uartNodeName())
	if cfg.InitrdEnd != 0 {
		w.PropertyU64("linux,initrd-start", cfg.InitrdStart)
		w.PropertyU64("linux,initrd-end", cfg.InitrdEnd)
	}
	w.EndNode()
}

// writeCPUs writes /cpus: one cpu node per vCPU, reg its MPIDR affinity
// (one cell: Aff3 is always 0), started through PSCI.
func writeCPUs(w *fdtWriter, cpus int) {
	w.BeginNode("cpus")
	w.PropertyCells("#address-cells", 1)
	w.PropertyCells("#size-cells", 0)
	for i := range cpus {
		mpidr := MPIDR(i)
		w.BeginNode(fmt.Sprintf("cpu@%x", mpidr))
		w.PropertyString("device_type", "cpu")
		w.PropertyString("compatible", "arm,arm-v8")
		w.PropertyString("enable-method", "psci")
		w.PropertyCells("reg", uint32(mpidr))
		w.EndNode()
	}
	w.EndNode()
}

// writeGIC writes the interrupt controller: a GICv3's distributor and
// the redistributors of the vCPUs that exist, or a GICv2's distributor and
// CPU interface.
func writeGIC(w *fdtWriter, gic GIC, cpus int) {
	w.BeginNode(fmt.Sprintf("intc@%x", GICDistributorBase))
	if gic == GICv2 {
		w.PropertyString("compatible", "arm,cortex-a15-gic")
	} else {
		w.PropertyString("compatible", "arm,gic-v3")
	}
	w.PropertyCells("#interrupt-cells", 3)
	// #address-cells matters only to interrupt-map users (we have none),
	// but dtc insists on it for an interrupt provider.
	w.PropertyCells("#address-cells", 2)
	w.PropertyCells("#size-cells", 2)
	w.PropertyEmpty("interrupt-controller")
	if gic == GICv2 {
		w.PropertyU64("reg", GICDistributorBase, GICv2DistributorSize, GICv2CPUInterfaceBase, GICv2CPUInterfaceSize)
	} else {
		w.PropertyU64("reg", GICDistributorBase, GICDistributorSize, GICRedistributorBase, GICRedistributorSize(cpus))
	}
	w.PropertyCells("phandle", gicPhandle)
	w.EndNode()
}

// writeTimer writes the architected timer: its four PPIs, level-low as the
// arm,armv8-timer binding has them, and always-on (the guest never loses
// its timer in a low-power state). A GICv2's PPI specifiers also name the
// CPUs the interrupt reaches (the arm,gic binding's CPU mask, bits 8-15).
func writeTimer(w *fdtWriter, gic GIC, cpus int) {
	ppis := [timerInterruptLen]uint32{TimerSecurePPI, TimerNonSecurePPI, TimerVirtualPPI, TimerHypPPI}
	flags := irqLevelLow
	if gic == GICv2 {
		flags |= (1<<uint(cpus) - 1) << gicV2PPICPUMaskShift
	}
	cells := make([]uint32, 0, 3*timerInterruptLen)
	for _, ppi := range ppis {
		cells = append(cells, gicPPI, ppi, flags)
	}
	w.BeginNode("timer")
	w.PropertyString("compatible", "arm,armv8-timer")
	w.PropertyCells("interrupts", cells...)
	w.PropertyEmpty("always-on")
	w.EndNode()
}

// writeUART writes the 16550 console: byte-wide registers one byte apart,
// edge-rising on its SPI like every device interrupt here (irqfd pulses).
func writeUART(w *fdtWriter) {
	w.BeginNode(uartNodeName())
	w.PropertyString("compatible", "ns16550a")
	w.PropertyU64("reg", UARTBase, UARTSize)
	w.PropertyCells("interrupts", gicSPI, UARTSPI, irqEdgeRising)
	w.PropertyCells("clock-frequency", UARTClockHz)
	w.PropertyCells("reg-shift", 0)
	w.PropertyCells("reg-io-width", 1)
	w.EndNode()
}
