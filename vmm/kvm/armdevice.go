package kvm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// The device-control API (KVM_CREATE_DEVICE and the device attribute
// ioctls on the fd it returns), with which arm64 creates its in-kernel
// GICv3. Generic _IOC numbers, from <linux/kvm.h>.
const (
	ioctlCreateDevice  = 0xc00caee0 // _IOWR(KVMIO, 0xe0, struct kvm_create_device)
	ioctlSetDeviceAttr = 0x4018aee1 // _IOW(KVMIO, 0xe1, struct kvm_device_attr)
	ioctlGetDeviceAttr = 0x4018aee2 // _IOW(KVMIO, 0xe2, struct kvm_device_attr)
	ioctlHasDeviceAttr = 0x4018aee3 // _IOW(KVMIO, 0xe3, struct kvm_device_attr)

	// createDeviceTest (KVM_CREATE_DEVICE_TEST) asks whether the device
	// type could be created, without creating it.
	createDeviceTest = 1
)

// DeviceARMVGICv3 is KVM_DEV_TYPE_ARM_VGIC_V3, the in-kernel GICv3.
const DeviceARMVGICv3 = 7

// DeviceARMVGICv2 is KVM_DEV_TYPE_ARM_VGIC_V2, the in-kernel GICv2: all
// that a host whose own GIC is a GICv2 (a Raspberry Pi 4 or 5) can give
// its guests. Its groups are the GICv3's where they share a number
// (Documentation/virt/kvm/devices/arm-vgic.rst).
const DeviceARMVGICv2 = 5

// GICv2 attributes: the frames' addresses (VGICGroupAddr), and the
// registers of the distributor and of the CPU interfaces, both named by a
// vCPU index and an offset (VGICV2RegAttr).
const (
	VGICV2AddrDist = 0 // distributor, 4 KiB
	VGICV2AddrCPU  = 1 // CPU interface, 8 KiB
	// VGICGroupCPURegs: a vCPU's GICv2 CPU interface registers (GICC_*).
	VGICGroupCPURegs = 2
)

// VGICV2RegAttr is the attribute of a GICv2 distributor or CPU interface
// register at offset, as vCPU cpu sees it (the distributor banks the
// first 32 interrupts' registers per vCPU).
func VGICV2RegAttr(cpu int, offset uint32) uint64 {
	return uint64(cpu&0xff)<<vgicMPIDRShift | uint64(offset)
}

// VGIC attribute groups and attributes (KVM_DEV_ARM_VGIC_*,
// Documentation/virt/kvm/devices/arm-vgic-v3.rst).
const (
	// VGICGroupAddr sets the guest-physical base of a GIC frame, attr
	// VGICV3AddrDist or VGICV3AddrRedist, the value the 64-bit address.
	VGICGroupAddr    = 0
	VGICV3AddrDist   = 2 // distributor, 64 KiB
	VGICV3AddrRedist = 3 // redistributors, 128 KiB per vCPU, contiguous
	// VGICGroupDistRegs: distributor registers, attr VGICV3RegAttr(0, offset).
	VGICGroupDistRegs = 1
	// VGICGroupNrIRQs sets the number of interrupts (32 private + the
	// SPIs, a multiple of 32, at most 1024), attr 0.
	VGICGroupNrIRQs = 3
	// VGICGroupCtrl: attr VGICCtrlInit finishes creation (after the
	// addresses, the IRQ count and every vCPU); VGICCtrlSavePendingTables
	// writes the LPI pending tables to guest memory before a snapshot.
	VGICGroupCtrl             = 4
	VGICCtrlInit              = 0
	VGICCtrlSavePendingTables = 3
	// VGICGroupRedistRegs: one vCPU's redistributor registers, attr
	// VGICV3RegAttr(mpidr, offset).
	VGICGroupRedistRegs = 5
	// VGICGroupCPUSysregs: one vCPU's GIC CPU interface system registers
	// (ICC_*), attr VGICV3SysregAttr(mpidr, op0, op1, crn, crm, op2).
	VGICGroupCPUSysregs = 6
	// VGICGroupLevelInfo: the line levels of level-triggered SPIs, 32 per
	// attribute, attr VGICV3LevelInfoAttr(mpidr, intid).
	VGICGroupLevelInfo = 7
)

// vgicMPIDRShift places the vCPU's affinity (Aff3.Aff2.Aff1.Aff0, 8 bits
// each) in the upper half of a per-vCPU VGIC attribute.
const vgicMPIDRShift = 32

// vgicAffinity packs MPIDR_EL1's affinity fields (Aff0-2 in bits 0-23,
// Aff3 in bits 32-39) the way the VGIC attributes name a vCPU.
func vgicAffinity(mpidr uint64) uint64 {
	return (mpidr>>32&0xff)<<24 | mpidr&0xffffff
}

// VGICV3RegAttr is the attribute of a distributor (mpidr 0) or a vCPU's
// redistributor register at offset in its frame.
func VGICV3RegAttr(mpidr uint64, offset uint32) uint64 {
	return vgicAffinity(mpidr)<<vgicMPIDRShift | uint64(offset)
}

// VGICV3SysregAttr is the attribute of a vCPU's GIC CPU interface system
// register (ICC_*), by its encoding.
func VGICV3SysregAttr(mpidr, op0, op1, crn, crm, op2 uint64) uint64 {
	instr := (op0&3)<<14 | (op1&7)<<11 | (crn&0xf)<<7 | (crm&0xf)<<3 | op2&7
	return vgicAffinity(mpidr)<<vgicMPIDRShift | instr
}

// VGICV3LevelInfoAttr is the attribute of the line levels of the 32
// interrupts from intid (a multiple of 32) upward.
func VGICV3LevelInfoAttr(mpidr uint64, intid uint32) uint64 {
	const levelInfoShift, lineLevel = 10, 0
	return vgicAffinity(mpidr)<<vgicMPIDRShift | lineLevel<<levelInfoShift | uint64(intid&0x3ff)
}

// Device is an in-kernel device KVM_CREATE_DEVICE made (its fd).
type Device struct {
	fd  int
	typ uint32
}

// CreateDevice issues KVM_CREATE_DEVICE for a device of type typ
// (DeviceARMVGICv3, …). Close it when the VM is torn down; the kernel
// keeps the device for the VM's lifetime either way.
func (vm *VM) CreateDevice(typ uint32) (*Device, error) {
	arg := createDeviceArg{Type: typ}
	if _, err := ioctlStruct(vm.fd, ioctlCreateDevice, &arg); err != nil {
		return nil, fmt.Errorf("KVM_CREATE_DEVICE type %d: %w", typ, err)
	}
	return &Device{fd: int(arg.FD), typ: typ}, nil
}

// CanCreateDevice issues KVM_CREATE_DEVICE with KVM_CREATE_DEVICE_TEST:
// nil when this VM could create a device of type typ, which it does not.
func (vm *VM) CanCreateDevice(typ uint32) error {
	arg := createDeviceArg{Type: typ, Flags: createDeviceTest}
	if _, err := ioctlStruct(vm.fd, ioctlCreateDevice, &arg); err != nil {
		return fmt.Errorf("KVM_CREATE_DEVICE (test) type %d: %w", typ, err)
	}
	return nil
}

// Close closes the device fd.
func (d *Device) Close() error {
	if d == nil || d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// SetAttr issues KVM_SET_DEVICE_ATTR. val is the value the attribute's
// addr points to, or nil for an attribute that takes none (VGICCtrlInit).
// KVM reads 32 bits of it for 32-bit attributes (the VGIC registers,
// VGICGroupNrIRQs): the low half, on a little-endian host.
func (d *Device) SetAttr(group uint32, attr uint64, val *uint64) error {
	if err := deviceAttr(d.fd, ioctlSetDeviceAttr, group, attr, val); err != nil {
		return fmt.Errorf("KVM_SET_DEVICE_ATTR device type %d group %d attr %#x: %w", d.typ, group, attr, err)
	}
	return nil
}

// GetAttr issues KVM_GET_DEVICE_ATTR for a 64-bit attribute (32-bit ones,
// such as the VGIC registers and line levels, come zero-extended).
func (d *Device) GetAttr(group uint32, attr uint64) (uint64, error) {
	var v uint64
	if err := deviceAttr(d.fd, ioctlGetDeviceAttr, group, attr, &v); err != nil {
		return 0, fmt.Errorf("KVM_GET_DEVICE_ATTR device type %d group %d attr %#x: %w", d.typ, group, attr, err)
	}
	return v, nil
}

// HasAttr issues KVM_HAS_DEVICE_ATTR: whether the device knows the
// attribute. Any error (ENXIO for an unknown one) means no.
func (d *Device) HasAttr(group uint32, attr uint64) bool {
	return deviceAttr(d.fd, ioctlHasDeviceAttr, group, attr, nil) == nil
}
