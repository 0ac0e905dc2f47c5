package kvm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// VM is a KVM virtual machine (the fd KVM_CREATE_VM returns).
type VM struct {
	fd           int
	vcpuMmapSize int
}

// Close closes the VM fd. The kernel frees the VM once every vCPU fd is
// closed too.
func (vm *VM) Close() error {
	if vm == nil || vm.fd < 0 {
		return nil
	}
	err := unix.Close(vm.fd)
	vm.fd = -1
	return err
}

// CheckExtension issues KVM_CHECK_EXTENSION on the VM (answers for this VM).
func (vm *VM) CheckExtension(c Capability) (int, error) {
	r, err := ioctlValue(vm.fd, ioctlCheckExtension, uintptr(c))
	return int(r), err
}

// SetTSSAddr issues KVM_SET_TSS_ADDR: three pages of guest-physical address
// space, not backed by RAM, that Intel VMX needs for real mode.
func (vm *VM) SetTSSAddr(gpa uint64) error {
	if _, err := ioctlValue(vm.fd, ioctlSetTSSAddr, uintptr(gpa)); err != nil {
		return fmt.Errorf("KVM_SET_TSS_ADDR %#x: %w", gpa, err)
	}
	return nil
}

// SetIdentityMapAddr issues KVM_SET_IDENTITY_MAP_ADDR: one page of
// guest-physical space for the EPT identity map of real mode on Intel.
func (vm *VM) SetIdentityMapAddr(gpa uint64) error {
	addr := gpa
	if _, err := ioctlStruct(vm.fd, ioctlSetIdentityMapAddr, &addr); err != nil {
		return fmt.Errorf("KVM_SET_IDENTITY_MAP_ADDR %#x: %w", gpa, err)
	}
	return nil
}

// CreateIRQChip issues KVM_CREATE_IRQCHIP: an in-kernel PIC pair, IOAPIC and
// a local APIC per vCPU. Call it before CreateVCPU.
func (vm *VM) CreateIRQChip() error {
	if _, err := ioctlValue(vm.fd, ioctlCreateIRQChip, 0); err != nil {
		return fmt.Errorf("KVM_CREATE_IRQCHIP: %w", err)
	}
	return nil
}

// CreatePIT2 issues KVM_CREATE_PIT2: an in-kernel i8254 timer, with the PC
// speaker port (0x61) left to KVM as a dummy.
func (vm *VM) CreatePIT2() error {
	arg := pitConfigArg{Flags: pitSpeakerDummy}
	if _, err := ioctlStruct(vm.fd, ioctlCreatePIT2, &arg); err != nil {
		return fmt.Errorf("KVM_CREATE_PIT2: %w", err)
	}
	return nil
}

// SetUserMemoryRegion issues KVM_SET_USER_MEMORY_REGION, mapping host memory
// at UserspaceAddr into the guest at GuestPhysAddr.
func (vm *VM) SetUserMemoryRegion(r UserspaceMemoryRegion) error {
	if _, err := ioctlStruct(vm.fd, ioctlSetUserMemoryRegion, &r); err != nil {
		return fmt.Errorf("KVM_SET_USER_MEMORY_REGION slot %d gpa %#x size %#x: %w",
			r.Slot, r.GuestPhysAddr, r.MemorySize, err)
	}
	return nil
}

// IRQLine issues KVM_IRQ_LINE: sets the level of an in-kernel irqchip input
// (GSI). An edge is a 1 followed by a 0. On arm64 gsi is the encoded irq
// field instead: ARMIRQLineSPI(intid) for a shared peripheral interrupt.
func (vm *VM) IRQLine(gsi uint32, high bool) error {
	arg := irqLevelArg{IRQ: gsi}
	if high {
		arg.Level = 1
	}
	if _, err := ioctlStruct(vm.fd, ioctlIRQLine, &arg); err != nil {
		return fmt.Errorf("KVM_IRQ_LINE gsi %d: %w", gsi, err)
	}
	return nil
}

// IRQFD issues KVM_IRQFD: afterwards each write to eventfd pulses GSI gsi.
// On arm64, through the GICv3's default routing, GSI n is SPI n (INTID
// 32+n).
func (vm *VM) IRQFD(eventfd int, gsi uint32) error {
	arg := irqfdArg{FD: uint32(eventfd), GSI: gsi}
	if _, err := ioctlStruct(vm.fd, ioctlIRQFD, &arg); err != nil {
		return fmt.Errorf("KVM_IRQFD gsi %d: %w", gsi, err)
	}
	return nil
}

// DeassignIRQFD undoes IRQFD.
func (vm *VM) DeassignIRQFD(eventfd int, gsi uint32) error {
	arg := irqfdArg{FD: uint32(eventfd), GSI: gsi, Flags: irqfdFlagDeassign}
	if _, err := ioctlStruct(vm.fd, ioctlIRQFD, &arg); err != nil {
		return fmt.Errorf("KVM_IRQFD deassign gsi %d: %w", gsi, err)
	}
	return nil
}

// IOEventFD describes a KVM_IOEVENTFD registration: a guest write of Len
// bytes (1, 2, 4 or 8) to Addr signals the eventfd instead of exiting.
type IOEventFD struct {
	Addr      uint64
	Len       uint32
	EventFD   int
	PIO       bool    // port I/O space rather than MMIO
	Datamatch *uint64 // only writes of this value, when set
}

// SetIOEventFD issues KVM_IOEVENTFD (assign, or deassign when assign is false).
func (vm *VM) SetIOEventFD(e IOEventFD, assign bool) error {
	arg := ioeventfdArg{Addr: e.Addr, Len: e.Len, FD: int32(e.EventFD)}
	if e.PIO {
		arg.Flags |= ioeventfdFlagPIO
	}
	if e.Datamatch != nil {
		arg.Flags |= ioeventfdFlagDatamatch
		arg.Datamatch = *e.Datamatch
	}
	if !assign {
		arg.Flags |= ioeventfdFlagDeassign
	}
	if _, err := ioctlStruct(vm.fd, ioctlIOEventFD, &arg); err != nil {
		return fmt.Errorf("KVM_IOEVENTFD addr %#x: %w", e.Addr, err)
	}
	return nil
}

// CreateVCPU issues KVM_CREATE_VCPU with the given id (on x86 its APIC ID,
// on arm64 the source of its MPIDR_EL1 affinity) and maps its kvm_run
// area. The vCPU with id 0 is the bootstrap processor.
func (vm *VM) CreateVCPU(id int) (*VCPU, error) {
	r, err := ioctlValue(vm.fd, ioctlCreateVCPU, uintptr(id))
	if err != nil {
		return nil, fmt.Errorf("KVM_CREATE_VCPU %d: %w", id, err)
	}
	fd := int(r)
	if vm.vcpuMmapSize < runMinSize {
		unix.Close(fd)
		return nil, fmt.Errorf("kvm_run area of %d bytes is smaller than %d", vm.vcpuMmapSize, runMinSize)
	}
	run, err := unix.Mmap(fd, 0, vm.vcpuMmapSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap kvm_run of vCPU %d: %w", id, err)
	}
	return &VCPU{fd: fd, id: id, run: run}, nil
}
