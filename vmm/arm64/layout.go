package arm64

import (
	"errors"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// The guest physical address layout, close to qemu's "virt" machine and
// Firecracker's arch/aarch64/layout.rs. Devices live in the first 2 GiB,
// RAM is one region from 2 GiB up. The kernel, the initrd and the device
// tree all go in RAM (see PrepareBoot for where).
//
//	0x0900_0000  16550 UART, 4 KiB (UARTBase), SPI 1
//	0x0901_0000  boot timer page (BootTimerBase), not in the device tree
//	0x0902_0000  snapshot point page (SnapshotPointBase), not in the tree
//	0x0A00_0000  virtio-mmio devices, 4 KiB each, up to 32, SPI 16 upward
//	0x3F7F_0000  GICv3 redistributors, 128 KiB per vCPU, room for MaxCPUs
//	0x3FFE_0000  or, with a GICv2, its CPU interface, 8 KiB
//	0x3FFF_0000  GICv3 distributor, 64 KiB (a GICv2's, 4 KiB)
//	0x8000_0000  RAM (RAMBase): the kernel at RAMBase + text_offset, ...,
//	             the initrd, then the device tree in the last 2 MiB slot
//	             (both below RAMBase + BootWindowSize)
//	...          up to RAMBase + MaxRAM (the default 40-bit IPA space)
const (
	// RAMBase is the first byte of guest RAM. It is 1 GiB-aligned, so the
	// boot protocol's 32 GiB initrd window can start there.
	RAMBase uint64 = 0x8000_0000
	// DefaultIPABits is the guest physical address width KVM gives a VM
	// created with machine type 0: 40 bits (1 TiB).
	DefaultIPABits = 40
	// MaxRAM bounds the guest RAM size so that RAM ends within the default
	// IPA space.
	MaxRAM uint64 = 1<<DefaultIPABits - RAMBase
	// MinRAM is the smallest guest RAM: the kernel's 2 MiB-aligned slot and
	// the device tree's 2 MiB slot. A real kernel needs far more; PrepareBoot
	// checks the image fits.
	MinRAM uint64 = 2 * DTBMaxSize
	// RAMAlign is the granule of the guest RAM size: 64 KiB, the largest
	// arm64 page size, so the one memory slot is a whole number of host
	// pages on 4K, 16K and 64K hosts alike.
	RAMAlign uint64 = 0x1_0000

	// GICDistributorBase is the GICv3 distributor's MMIO base
	// (KVM_VGIC_V3_ADDR_TYPE_DIST).
	GICDistributorBase uint64 = 0x3FFF_0000
	// GICDistributorSize is the distributor's MMIO window (64 KiB).
	GICDistributorSize uint64 = 0x1_0000
	// GICRedistributorStride is one vCPU's redistributor: the RD_base and
	// SGI_base 64 KiB frames.
	GICRedistributorStride uint64 = 0x2_0000
	// GICRedistributorBase is the first vCPU's redistributor
	// (KVM_VGIC_V3_ADDR_TYPE_REDIST); vCPU i's is at base + i*stride. The
	// region has room for MaxCPUs and ends at the distributor, so the base
	// does not depend on the vCPU count.
	GICRedistributorBase uint64 = GICDistributorBase - GICRedistributorStride*MaxCPUs

	// MaxCPUs is the most vCPUs the layout supports: their redistributors
	// (8 MiB for 64) fit between the last platform device and the
	// distributor. vCPUs 16 and up use MPIDR affinity level 1 (see MPIDR).
	MaxCPUs = 64

	// SPIBase is the GIC INTID of SPI 0: INTID = SPIBase + SPI. Device
	// interrupts are numbered as SPIs here and in KVM_IRQFD (GSI = SPI).
	SPIBase = 32
	// GICIRQs is the interrupt count to give the vGIC
	// (KVM_DEV_ARM_VGIC_GRP_NR_IRQS): the 32 private INTIDs and 96 SPIs,
	// which cover the UART and every virtio-mmio device.
	GICIRQs = 128

	// Timer PPIs, as PPI numbers (INTID = 16 + PPI) in the order of the
	// arm,armv8-timer binding's interrupts property.
	TimerSecurePPI    = 13 // secure EL1 physical timer, INTID 29
	TimerNonSecurePPI = 14 // non-secure EL1 physical timer, INTID 30
	TimerVirtualPPI   = 11 // EL1 virtual timer, INTID 27 (the one KVM guests use)
	TimerHypPPI       = 10 // EL2 physical timer, INTID 26
	// PPIBase is the GIC INTID of PPI 0.
	PPIBase = 16
	// The timers' INTIDs, as KVM_ARM_VCPU_TIMER_CTRL's attributes take
	// them (KVM's defaults too).
	TimerVirtualINTID   = PPIBase + TimerVirtualPPI
	TimerNonSecureINTID = PPIBase + TimerNonSecurePPI

	// PlatformPageSize is the MMIO window of the UART and of the boot
	// timer and snapshot point pages.
	PlatformPageSize uint64 = 0x1000

	// UARTBase is the 16550 console's MMIO base (byte registers,
	// reg-shift 0).
	UARTBase uint64 = 0x0900_0000
	// UARTSize is the UART's MMIO window.
	UARTSize = PlatformPageSize
	// UARTSPI is the UART's interrupt.
	UARTSPI = 1
	// UARTClockHz is the clock the device tree announces for the UART, the
	// classic 1.8432 MHz crystal: the 8250 driver needs one to compute
	// divisors, and our UART ignores them.
	UARTClockHz = 1843200

	// BootTimerBase is the boot-timer page (our own device, not in the
	// device tree: only our guest agent knows it; protocol/guesthost owns
	// the address, which the guest uses too).
	BootTimerBase uint64 = guesthost.BootTimerMMIO
	// SnapshotPointBase is the snapshot-point page (our own device, not in
	// the device tree).
	SnapshotPointBase uint64 = guesthost.SnapshotPointMMIO

	// VirtioMMIOBase is the first virtio-mmio device window; device i is at
	// VirtioMMIOBase + i*VirtioMMIOSize (see VirtioDevice).
	VirtioMMIOBase uint64 = 0x0A00_0000
	// VirtioMMIOSize is the window of one virtio-mmio device.
	VirtioMMIOSize uint64 = 0x1000
	// VirtioMMIOMaxDevices bounds the virtio-mmio devices.
	VirtioMMIOMaxDevices = 32
	// FirstVirtioSPI is virtio-mmio device 0's SPI; device i uses
	// FirstVirtioSPI + i.
	FirstVirtioSPI = 16
)

// GIC is the kind of interrupt controller the VM has: a GICv3 where the
// host's KVM can emulate one, else a GICv2 (hosts whose own GIC is a
// GICv2, such as the Raspberry Pi 4 and 5, can give guests only that).
type GIC int

const (
	GICv3 GIC = iota
	GICv2
)

func (g GIC) String() string {
	if g == GICv2 {
		return "GICv2"
	}
	return "GICv3"
}

// The GICv2's frames. Both are 64 KiB-aligned, so that KVM can map the
// host's virtual CPU interface there on 64 KiB-page hosts too.
const (
	// GICv2DistributorSize is the GICv2 distributor's window; it sits at
	// GICDistributorBase.
	GICv2DistributorSize uint64 = 0x1000
	// GICv2CPUInterfaceBase is the GICv2 CPU interface's MMIO base
	// (KVM_VGIC_V2_ADDR_TYPE_CPU), in the GICv3 redistributors' place.
	GICv2CPUInterfaceBase uint64 = 0x3FFE_0000
	// GICv2CPUInterfaceSize is the CPU interface's window.
	GICv2CPUInterfaceSize uint64 = 0x2000
	// MaxCPUsGICv2 is the most vCPUs a GICv2 serves (its target lists
	// are 8 bits wide).
	MaxCPUsGICv2 = 8
)

// MemoryRegion is one contiguous range of guest RAM the VMM must back with
// host memory (one KVM memory slot).
type MemoryRegion struct {
	GPA  uint64
	Size uint64
}

// End returns the first address after the region.
func (r MemoryRegion) End() uint64 { return r.GPA + r.Size }

// ErrBadMemorySize is returned for a guest RAM size the layout cannot hold.
var ErrBadMemorySize = errors.New("bad guest memory size")

// CheckMemorySize reports whether memBytes is a usable guest RAM size: a
// multiple of RAMAlign, at least MinRAM and at most MaxRAM.
func CheckMemorySize(memBytes uint64) error {
	switch {
	case memBytes%RAMAlign != 0:
		return fmt.Errorf("%w: %d bytes is not a multiple of 64 KiB", ErrBadMemorySize, memBytes)
	case memBytes < MinRAM:
		return fmt.Errorf("%w: %d bytes is below the %d-byte minimum", ErrBadMemorySize, memBytes, MinRAM)
	case memBytes > MaxRAM:
		return fmt.Errorf("%w: %d bytes exceeds the %d-byte maximum (40-bit guest physical addresses)", ErrBadMemorySize, memBytes, MaxRAM)
	}
	return nil
}

// MemoryRegions returns the guest RAM of memBytes bytes: one region at
// RAMBase.
func MemoryRegions(memBytes uint64) ([]MemoryRegion, error) {
	if err := CheckMemorySize(memBytes); err != nil {
		return nil, err
	}
	return []MemoryRegion{{GPA: RAMBase, Size: memBytes}}, nil
}

// GICRedistributorSize is the redistributor region of cpus vCPUs, from
// GICRedistributorBase.
func GICRedistributorSize(cpus int) uint64 {
	return GICRedistributorStride * uint64(cpus)
}

// MPIDR returns vCPU index's MPIDR_EL1 affinity (Aff2.Aff1.Aff0, without
// the RES1 bit 31) as KVM assigns it: 16 vCPUs per Aff0 cluster, so GICv3
// SGI target lists stay compact. It is the cpu node's reg in the device
// tree.
func MPIDR(index int) uint64 {
	id := uint64(index)
	return id&0xf | (id>>4&0xff)<<8 | (id>>12&0xff)<<16
}

// MMIODevice is one virtio-mmio device as the device tree announces it.
type MMIODevice struct {
	// Base is the device's window, VirtioMMIOSize bytes.
	Base uint64
	// SPI is the device's interrupt (GSI for KVM_IRQFD; INTID SPIBase+SPI).
	SPI uint32
}

// VirtioDevice returns the layout's virtio-mmio device i: the i'th window
// and SPI. i must be in [0, VirtioMMIOMaxDevices); DeviceTree rejects
// devices outside the window.
func VirtioDevice(i int) MMIODevice {
	return MMIODevice{
		Base: VirtioMMIOBase + uint64(i)*VirtioMMIOSize,
		SPI:  uint32(FirstVirtioSPI + i),
	}
}
