package kvm

import (
	"testing"
	"unsafe"
)

// The expected values in this file are what aarch64-linux-gnu-gcc computes
// from Linux 6.1's <linux/kvm.h> and arm64 <asm/kvm.h> (sizeof, offsetof,
// the ioctl and register-id macros), printed by a C program.

// The arm64 ioctls, and the generic ones the VMM issues on arm64 too, have
// the same numbers on both architectures: these are the arm64 kernel's.
func TestARM64IoctlNumbersMatchKernel(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"KVM_ARM_PREFERRED_TARGET", ioctlARMPreferredTarget, 0x8020aeaf},
		{"KVM_ARM_VCPU_INIT", ioctlARMVCPUInit, 0x4020aeae},
		{"KVM_GET_ONE_REG", ioctlGetOneReg, 0x4010aeab},
		{"KVM_SET_ONE_REG", ioctlSetOneReg, 0x4010aeac},
		{"KVM_GET_REG_LIST", ioctlGetRegList, 0xc008aeb0},
		{"KVM_CREATE_DEVICE", ioctlCreateDevice, 0xc00caee0},
		{"KVM_SET_DEVICE_ATTR", ioctlSetDeviceAttr, 0x4018aee1},
		{"KVM_GET_DEVICE_ATTR", ioctlGetDeviceAttr, 0x4018aee2},
		{"KVM_HAS_DEVICE_ATTR", ioctlHasDeviceAttr, 0x4018aee3},
		{"KVM_CREATE_DEVICE_TEST", createDeviceTest, 1},
		{"KVM_IRQ_LINE", ioctlIRQLine, 0x4008ae61},
		{"KVM_IRQFD", ioctlIRQFD, 0x4020ae76},
		{"KVM_IOEVENTFD", ioctlIOEventFD, 0x4040ae79},
		{"KVM_SET_USER_MEMORY_REGION", ioctlSetUserMemoryRegion, 0x4020ae46},
		{"KVM_SET_SIGNAL_MASK", ioctlSetSignalMask, 0x4004ae8b},
		{"KVM_GET_MP_STATE", ioctlGetMPState, 0x8004ae98},
		{"KVM_SET_MP_STATE", ioctlSetMPState, 0x4004ae99},
		{"KVM_RUN", ioctlRun, 0xae80},
		{"KVM_CREATE_VCPU", ioctlCreateVCPU, 0xae41},
		{"KVM_CREATE_VM", ioctlCreateVM, 0xae01},
		{"KVM_CHECK_EXTENSION", ioctlCheckExtension, 0xae03},
		{"KVM_GET_VCPU_MMAP_SIZE", ioctlGetVCPUMmapSize, 0xae04},
		{"KVM_GET_API_VERSION", ioctlGetAPIVersion, 0xae00},
		{"KVM_SET_GSI_ROUTING", ioctlSetGSIRouting, 0x4008ae6a},
		{"KVM_GET_STATS_FD", ioctlGetStatsFD, 0xaece},
		// arm64's struct kvm_vcpu_events is 64 bytes too (a pending
		// SError and external data abort): VCPUEvents serves both.
		{"KVM_GET_VCPU_EVENTS", ioctlGetVCPUEvents, 0x8040ae9f},
		{"KVM_SET_VCPU_EVENTS", ioctlSetVCPUEvents, 0x4040aea0},
	} {
		if c.got != c.want {
			t.Errorf("%s: Go %#x, kernel %#x", c.name, c.got, c.want)
		}
	}
}

func TestARM64StructLayoutsMatchKernel(t *testing.T) {
	size := func(req uintptr) uintptr { return (req >> 16) & 0x3fff }
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof kvm_vcpu_init", unsafe.Sizeof(VCPUInit{}), 32},
		{"sizeof kvm_one_reg", unsafe.Sizeof(oneRegArg{}), 16},
		{"offsetof kvm_one_reg.addr", unsafe.Offsetof(oneRegArg{}.Addr), 8},
		{"sizeof kvm_create_device", unsafe.Sizeof(createDeviceArg{}), 12},
		{"offsetof kvm_create_device.fd", unsafe.Offsetof(createDeviceArg{}.FD), 4},
		{"sizeof kvm_device_attr", unsafe.Sizeof(deviceAttrArg{}), 24},
		{"offsetof kvm_device_attr.attr", unsafe.Offsetof(deviceAttrArg{}.Attr), 8},
		{"offsetof kvm_device_attr.addr", unsafe.Offsetof(deviceAttrArg{}.Addr), 16},
		{"KVM_ARM_PREFERRED_TARGET size", size(ioctlARMPreferredTarget), unsafe.Sizeof(VCPUInit{})},
		{"KVM_ARM_VCPU_INIT size", size(ioctlARMVCPUInit), unsafe.Sizeof(VCPUInit{})},
		{"KVM_GET_ONE_REG size", size(ioctlGetOneReg), unsafe.Sizeof(oneRegArg{})},
		{"KVM_SET_ONE_REG size", size(ioctlSetOneReg), unsafe.Sizeof(oneRegArg{})},
		{"KVM_GET_REG_LIST header", size(ioctlGetRegList), 8},
		{"KVM_CREATE_DEVICE size", size(ioctlCreateDevice), unsafe.Sizeof(createDeviceArg{})},
		{"KVM_SET_DEVICE_ATTR size", size(ioctlSetDeviceAttr), unsafe.Sizeof(deviceAttrArg{})},
		{"KVM_GET_DEVICE_ATTR size", size(ioctlGetDeviceAttr), unsafe.Sizeof(deviceAttrArg{})},
		{"KVM_HAS_DEVICE_ATTR size", size(ioctlHasDeviceAttr), unsafe.Sizeof(deviceAttrArg{})},
		// struct kvm_regs on arm64 (864 bytes).
		{"offsetof kvm_regs.regs.sp", arm64OffSP, 0xf8},
		{"offsetof kvm_regs.regs.pc", arm64OffPC, 0x100},
		{"offsetof kvm_regs.regs.pstate", arm64OffPSTATE, 0x108},
		{"offsetof kvm_regs.sp_el1", arm64OffSPEL1, 0x110},
		{"offsetof kvm_regs.elr_el1", arm64OffELREL1, 0x118},
		{"offsetof kvm_regs.spsr", arm64OffSPSR, 0x120},
		{"offsetof kvm_regs.fp_regs.vregs", arm64OffVRegs, 0x150},
		{"offsetof kvm_regs.fp_regs.fpsr", arm64OffFPSR, 0x350},
		{"offsetof kvm_regs.fp_regs.fpcr", arm64OffFPCR, 0x354},
	} {
		if c.got != c.want {
			t.Errorf("%s: Go %d, kernel %d", c.name, c.got, c.want)
		}
	}
}

func TestARM64RegisterIDsMatchKernel(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"x0", ARM64RegX(0), 0x6030000000100000},
		{"x30", ARM64RegX(30), 0x603000000010003c},
		{"sp", ARM64RegSP, 0x603000000010003e},
		{"pc", ARM64RegPC, 0x6030000000100040},
		{"pstate", ARM64RegPSTATE, 0x6030000000100042},
		{"sp_el1", ARM64RegSPEL1, 0x6030000000100044},
		{"elr_el1", ARM64RegELREL1, 0x6030000000100046},
		{"spsr[4]", ARM64RegSPSR(4), 0x6030000000100050},
		{"vregs[31]", ARM64RegV(31), 0x60400000001000d0},
		{"fpsr", ARM64RegFPSR, 0x60200000001000d4},
		{"fpcr", ARM64RegFPCR, 0x60200000001000d5},
		{"MPIDR_EL1", ARM64RegMPIDR, 0x603000000013c005},
		{"SCTLR_EL1", ARM64SysReg(3, 0, 1, 0, 0), 0x603000000013c080},
		{"KVM_REG_ARM_TIMER_CTL", ARM64RegCNTVCTL, 0x603000000013df19},
		{"KVM_REG_ARM_TIMER_CNT", ARM64RegCNTVCT, 0x603000000013df1a},
		{"KVM_REG_ARM_TIMER_CVAL", ARM64RegCNTVCVAL, 0x603000000013df02},
		{"KVM_REG_ARM_PSCI_VERSION", ARM64RegPSCIVersion, 0x6030000000140000},
		{"KVM_REG_SIZE_MASK", kvmRegSizeMask, 0xf0000000000000},
		// KVM_IRQ_LINE irq for SPI INTID 40:
		// KVM_ARM_IRQ_TYPE_SPI << KVM_ARM_IRQ_TYPE_SHIFT | 40.
		{"KVM_IRQ_LINE SPI 40", uint64(ARMIRQLineSPI(40)), 0x1000028},
	} {
		if c.got != c.want {
			t.Errorf("%s: Go %#x, kernel %#x", c.name, c.got, c.want)
		}
	}
}

// The in-kernel GIC device types and attributes: <linux/kvm.h>'s enum
// kvm_device_type and arm64 <asm/kvm.h>'s VGIC definitions.
func TestARM64VGICConstantsMatchKernel(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"KVM_DEV_TYPE_ARM_VGIC_V2", DeviceARMVGICv2, 5},
		{"KVM_DEV_TYPE_ARM_VGIC_V3", DeviceARMVGICv3, 7},
		{"KVM_VGIC_V2_ADDR_TYPE_DIST", VGICV2AddrDist, 0},
		{"KVM_VGIC_V2_ADDR_TYPE_CPU", VGICV2AddrCPU, 1},
		{"KVM_VGIC_V3_ADDR_TYPE_DIST", VGICV3AddrDist, 2},
		{"KVM_VGIC_V3_ADDR_TYPE_REDIST", VGICV3AddrRedist, 3},
		{"KVM_DEV_ARM_VGIC_GRP_DIST_REGS", VGICGroupDistRegs, 1},
		{"KVM_DEV_ARM_VGIC_GRP_CPU_REGS", VGICGroupCPURegs, 2},
		// KVM_DEV_ARM_VGIC_CPUID_SHIFT is 32: vCPU 3's register 0x104.
		{"GICv2 register attribute", VGICV2RegAttr(3, 0x104), 3<<32 | 0x104},
	} {
		if c.got != c.want {
			t.Errorf("%s: Go %#x, kernel %#x", c.name, c.got, c.want)
		}
	}
}
