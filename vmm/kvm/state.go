package kvm

import (
	"encoding/binary"
	"fmt"
)

// The state a snapshot carries that KVM keeps opaque to the VMM: saved
// with a GET ioctl and given back unchanged to the SET ioctl of a fresh
// VM or vCPU on the same kind of host. Each mirrors its <linux/kvm.h>
// struct byte for byte (sizes checked by the layout test).

// VCPUEvents mirrors struct kvm_vcpu_events: pending exceptions,
// interrupts and NMIs, the interrupt shadow, SMM state. Its flags say
// which fields are valid; KVM_GET_VCPU_EVENTS sets them for SET. On arm64
// the structure (a pending SError or external data abort) has the same
// 64 bytes and the ioctls the same numbers.
type VCPUEvents struct{ Raw [64]byte }

// XSAVE mirrors struct kvm_xsave: the extended FPU/SIMD state, the part
// of the guest's registers KVM_GET_FPU leaves out (AVX and beyond).
type XSAVE struct{ Region [4096]byte }

// XCRS mirrors struct kvm_xcrs: the extended control registers (XCR0).
type XCRS struct{ Raw [392]byte }

// IRQChip mirrors struct kvm_irqchip: one in-kernel interrupt controller
// (chip_id, padding, then a 512-byte union of PIC or IOAPIC state).
type IRQChip struct{ Raw [520]byte }

// Chips of the in-kernel irqchip (struct kvm_irqchip.chip_id).
const (
	IRQChipPICMaster = 0
	IRQChipPICSlave  = 1
	IRQChipIOAPIC    = 2
)

// ID returns the chip's chip_id.
func (c *IRQChip) ID() uint32 { return binary.LittleEndian.Uint32(c.Raw[:4]) }

// PITState mirrors struct kvm_pit_state2: the in-kernel PIT's channels.
type PITState struct{ Raw [112]byte }

// ClockData mirrors struct kvm_clock_data: kvmclock's value in ns.
type ClockData struct {
	Clock    uint64
	Flags    uint32
	_        uint32
	Realtime uint64
	HostTSC  uint64
	_        [4]uint32
}

// State ioctls (<linux/kvm.h>; checked by the layout test).
const (
	ioctlGetVCPUEvents = 0x8040ae9f
	ioctlSetVCPUEvents = 0x4040aea0
	ioctlGetXSAVE      = 0x9000aea4
	ioctlSetXSAVE      = 0x5000aea5
	ioctlGetXCRS       = 0x8188aea6
	ioctlSetXCRS       = 0x4188aea7
	ioctlGetIRQChip    = 0xc208ae62
	ioctlSetIRQChip    = 0x8208ae63
	ioctlGetPIT2       = 0x8070ae9f
	ioctlSetPIT2       = 0x4070aea0
	ioctlGetClock      = 0x8030ae7c
	ioctlSetClock      = 0x4030ae7b
)

// stateIoctl issues one state ioctl on fd, naming it in the error.
func stateIoctl[T any](fd int, req uintptr, arg *T, name string, id int) error {
	if _, err := ioctlStruct(fd, req, arg); err != nil {
		return fmt.Errorf("%s (vCPU or VM %d): %w", name, id, err)
	}
	return nil
}

// GetVCPUEvents issues KVM_GET_VCPU_EVENTS.
func (c *VCPU) GetVCPUEvents() (VCPUEvents, error) {
	var e VCPUEvents
	return e, stateIoctl(c.fd, ioctlGetVCPUEvents, &e, "KVM_GET_VCPU_EVENTS", c.id)
}

// SetVCPUEvents issues KVM_SET_VCPU_EVENTS.
func (c *VCPU) SetVCPUEvents(e VCPUEvents) error {
	return stateIoctl(c.fd, ioctlSetVCPUEvents, &e, "KVM_SET_VCPU_EVENTS", c.id)
}

// GetXSAVE issues KVM_GET_XSAVE.
func (c *VCPU) GetXSAVE() (*XSAVE, error) {
	x := new(XSAVE)
	return x, stateIoctl(c.fd, ioctlGetXSAVE, x, "KVM_GET_XSAVE", c.id)
}

// SetXSAVE issues KVM_SET_XSAVE.
func (c *VCPU) SetXSAVE(x *XSAVE) error {
	return stateIoctl(c.fd, ioctlSetXSAVE, x, "KVM_SET_XSAVE", c.id)
}

// GetXCRS issues KVM_GET_XCRS.
func (c *VCPU) GetXCRS() (XCRS, error) {
	var x XCRS
	return x, stateIoctl(c.fd, ioctlGetXCRS, &x, "KVM_GET_XCRS", c.id)
}

// SetXCRS issues KVM_SET_XCRS.
func (c *VCPU) SetXCRS(x XCRS) error {
	return stateIoctl(c.fd, ioctlSetXCRS, &x, "KVM_SET_XCRS", c.id)
}

// GetIRQChip issues KVM_GET_IRQCHIP for chip (IRQChipPICMaster, …).
func (vm *VM) GetIRQChip(chip uint32) (IRQChip, error) {
	var c IRQChip
	binary.LittleEndian.PutUint32(c.Raw[:4], chip)
	return c, stateIoctl(vm.fd, ioctlGetIRQChip, &c, "KVM_GET_IRQCHIP", 0)
}

// SetIRQChip issues KVM_SET_IRQCHIP (the chip its chip_id names).
func (vm *VM) SetIRQChip(c IRQChip) error {
	return stateIoctl(vm.fd, ioctlSetIRQChip, &c, "KVM_SET_IRQCHIP", 0)
}

// GetPIT2 issues KVM_GET_PIT2.
func (vm *VM) GetPIT2() (PITState, error) {
	var p PITState
	return p, stateIoctl(vm.fd, ioctlGetPIT2, &p, "KVM_GET_PIT2", 0)
}

// SetPIT2 issues KVM_SET_PIT2.
func (vm *VM) SetPIT2(p PITState) error {
	return stateIoctl(vm.fd, ioctlSetPIT2, &p, "KVM_SET_PIT2", 0)
}

// GetClock issues KVM_GET_CLOCK.
func (vm *VM) GetClock() (ClockData, error) {
	var c ClockData
	return c, stateIoctl(vm.fd, ioctlGetClock, &c, "KVM_GET_CLOCK", 0)
}

// SetClock issues KVM_SET_CLOCK with the clock value only (flags 0: KVM
// takes no realtime or TSC hint).
func (vm *VM) SetClock(ns uint64) error {
	c := ClockData{Clock: ns}
	return stateIoctl(vm.fd, ioctlSetClock, &c, "KVM_SET_CLOCK", 0)
}

// GetMSRIndexList issues KVM_GET_MSR_INDEX_LIST: the MSRs KVM saves and
// restores for a guest.
func (s *System) GetMSRIndexList() ([]uint32, error) {
	arg := new(msrListArg)
	arg.Nmsrs = uint32(len(arg.Indices))
	if _, err := ioctlStruct(s.fd, ioctlGetMSRIndexList, arg); err != nil {
		return nil, fmt.Errorf("KVM_GET_MSR_INDEX_LIST: %w", err)
	}
	n := min(int(arg.Nmsrs), len(arg.Indices))
	return append([]uint32(nil), arg.Indices[:n]...), nil
}

// maxMSRIndices bounds KVM_GET_MSR_INDEX_LIST (KVM lists about a hundred).
const maxMSRIndices = 1024

// msrListArg mirrors struct kvm_msr_list with room for maxMSRIndices.
type msrListArg struct {
	Nmsrs   uint32
	Indices [maxMSRIndices]uint32
}
