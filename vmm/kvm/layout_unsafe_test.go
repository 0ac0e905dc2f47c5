package kvm

import (
	"testing"
	"unsafe"
)

// The expected values are sizeof/offsetof from <linux/kvm.h> on x86-64
// (printed by a C program against the kernel headers).
func TestStructLayoutsMatchKernelHeaders(t *testing.T) {
	sizes := []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"kvm_regs", unsafe.Sizeof(Regs{}), 144},
		{"kvm_segment", unsafe.Sizeof(Segment{}), 24},
		{"kvm_dtable", unsafe.Sizeof(DTable{}), 16},
		{"kvm_sregs", unsafe.Sizeof(Sregs{}), 312},
		{"kvm_fpu", unsafe.Sizeof(FPU{}), 416},
		{"kvm_msr_entry", unsafe.Sizeof(MSR{}), 16},
		{"kvm_cpuid_entry2", unsafe.Sizeof(CPUIDEntry{}), 40},
		{"kvm_userspace_memory_region", unsafe.Sizeof(UserspaceMemoryRegion{}), 32},
		{"kvm_irqfd", unsafe.Sizeof(irqfdArg{}), 32},
		{"kvm_ioeventfd", unsafe.Sizeof(ioeventfdArg{}), 64},
		{"kvm_irq_level", unsafe.Sizeof(irqLevelArg{}), 8},
		{"kvm_pit_config", unsafe.Sizeof(pitConfigArg{}), 64},
		{"kvm_lapic_state", unsafe.Sizeof(LAPICState{}), 1024},
		{"kvm_mp_state", unsafe.Sizeof(mpStateArg{}), 4},
		{"kvm_cpuid2 header", unsafe.Offsetof(cpuid2Arg{}.Entries), 8},
		{"kvm_msrs header", unsafe.Offsetof(msrsArg{}.Entries), 8},
		{"kvm_vcpu_events", unsafe.Sizeof(VCPUEvents{}), 64},
		{"kvm_xsave", unsafe.Sizeof(XSAVE{}), 4096},
		{"kvm_xcrs", unsafe.Sizeof(XCRS{}), 392},
		{"kvm_irqchip", unsafe.Sizeof(IRQChip{}), 520},
		{"kvm_pit_state2", unsafe.Sizeof(PITState{}), 112},
		{"kvm_clock_data", unsafe.Sizeof(ClockData{}), 48},
		{"kvm_msr_list header", unsafe.Offsetof(msrListArg{}.Indices), 4},
		{"kvm_signal_mask header", unsafe.Offsetof(signalMaskArg{}.Sigset), 4},
	}
	for _, s := range sizes {
		if s.got != s.want {
			t.Errorf("sizeof %s: Go %d, kernel %d", s.name, s.got, s.want)
		}
	}
	var sr Sregs
	offsets := []struct {
		name      string
		got, want uintptr
	}{
		{"kvm_sregs.gdt", unsafe.Offsetof(sr.GDT), 192},
		{"kvm_sregs.idt", unsafe.Offsetof(sr.IDT), 208},
		{"kvm_sregs.cr0", unsafe.Offsetof(sr.CR0), 224},
		{"kvm_sregs.efer", unsafe.Offsetof(sr.EFER), 264},
		{"kvm_sregs.apic_base", unsafe.Offsetof(sr.APICBase), 272},
		{"kvm_sregs.interrupt_bitmap", unsafe.Offsetof(sr.InterruptBitmap), 280},
		{"kvm_segment.selector", unsafe.Offsetof(sr.CS.Selector), 12},
		{"kvm_segment.unusable", unsafe.Offsetof(sr.CS.Unusable), 22},
		{"kvm_fpu.fcw", unsafe.Offsetof(FPU{}.FCW), 128},
		{"kvm_fpu.ftwx", unsafe.Offsetof(FPU{}.FTWX), 132},
		{"kvm_fpu.last_ip", unsafe.Offsetof(FPU{}.LastIP), 136},
		{"kvm_fpu.xmm", unsafe.Offsetof(FPU{}.XMM), 152},
		{"kvm_fpu.mxcsr", unsafe.Offsetof(FPU{}.MXCSR), 408},
		{"kvm_cpuid_entry2.eax", unsafe.Offsetof(CPUIDEntry{}.EAX), 12},
		{"kvm_irqfd.resamplefd", unsafe.Offsetof(irqfdArg{}.ResampleFD), 12},
		{"kvm_ioeventfd.fd", unsafe.Offsetof(ioeventfdArg{}.FD), 20},
		{"kvm_ioeventfd.flags", unsafe.Offsetof(ioeventfdArg{}.Flags), 24},
	}
	for _, o := range offsets {
		if o.got != o.want {
			t.Errorf("offsetof %s: Go %d, kernel %d", o.name, o.got, o.want)
		}
	}
}

// The size field of each _IOR/_IOW request number must equal the Go
// structure passed with it, or the kernel copies the wrong amount.
func TestIoctlNumbersEncodeStructSizes(t *testing.T) {
	size := func(req uintptr) uintptr { return (req >> 16) & 0x3fff }
	cases := []struct {
		name string
		req  uintptr
		want uintptr
	}{
		{"KVM_GET_REGS", ioctlGetRegs, unsafe.Sizeof(Regs{})},
		{"KVM_SET_REGS", ioctlSetRegs, unsafe.Sizeof(Regs{})},
		{"KVM_GET_SREGS", ioctlGetSregs, unsafe.Sizeof(Sregs{})},
		{"KVM_SET_SREGS", ioctlSetSregs, unsafe.Sizeof(Sregs{})},
		{"KVM_GET_FPU", ioctlGetFPU, unsafe.Sizeof(FPU{})},
		{"KVM_SET_FPU", ioctlSetFPU, unsafe.Sizeof(FPU{})},
		{"KVM_SET_USER_MEMORY_REGION", ioctlSetUserMemoryRegion, unsafe.Sizeof(UserspaceMemoryRegion{})},
		{"KVM_IRQFD", ioctlIRQFD, unsafe.Sizeof(irqfdArg{})},
		{"KVM_IOEVENTFD", ioctlIOEventFD, unsafe.Sizeof(ioeventfdArg{})},
		{"KVM_IRQ_LINE", ioctlIRQLine, unsafe.Sizeof(irqLevelArg{})},
		{"KVM_CREATE_PIT2", ioctlCreatePIT2, unsafe.Sizeof(pitConfigArg{})},
		{"KVM_GET_LAPIC", ioctlGetLAPIC, unsafe.Sizeof(LAPICState{})},
		{"KVM_SET_LAPIC", ioctlSetLAPIC, unsafe.Sizeof(LAPICState{})},
		{"KVM_GET_MP_STATE", ioctlGetMPState, unsafe.Sizeof(mpStateArg{})},
		{"KVM_SET_MP_STATE", ioctlSetMPState, unsafe.Sizeof(mpStateArg{})},
		{"KVM_SET_CPUID2 header", ioctlSetCPUID2, 8},
		{"KVM_SET_MSRS header", ioctlSetMSRs, 8},
		{"KVM_SET_IDENTITY_MAP_ADDR", ioctlSetIdentityMapAddr, 8},
		{"KVM_GET_VCPU_EVENTS", ioctlGetVCPUEvents, unsafe.Sizeof(VCPUEvents{})},
		{"KVM_SET_VCPU_EVENTS", ioctlSetVCPUEvents, unsafe.Sizeof(VCPUEvents{})},
		{"KVM_GET_XSAVE", ioctlGetXSAVE, unsafe.Sizeof(XSAVE{})},
		{"KVM_SET_XSAVE", ioctlSetXSAVE, unsafe.Sizeof(XSAVE{})},
		{"KVM_GET_XCRS", ioctlGetXCRS, unsafe.Sizeof(XCRS{})},
		{"KVM_SET_XCRS", ioctlSetXCRS, unsafe.Sizeof(XCRS{})},
		{"KVM_GET_IRQCHIP", ioctlGetIRQChip, unsafe.Sizeof(IRQChip{})},
		{"KVM_SET_IRQCHIP", ioctlSetIRQChip, unsafe.Sizeof(IRQChip{})},
		{"KVM_GET_PIT2", ioctlGetPIT2, unsafe.Sizeof(PITState{})},
		{"KVM_SET_PIT2", ioctlSetPIT2, unsafe.Sizeof(PITState{})},
		{"KVM_GET_CLOCK", ioctlGetClock, unsafe.Sizeof(ClockData{})},
		{"KVM_SET_CLOCK", ioctlSetClock, unsafe.Sizeof(ClockData{})},
		{"KVM_GET_MSR_INDEX_LIST header", ioctlGetMSRIndexList, 4},
	}
	for _, c := range cases {
		if got := size(c.req); got != c.want {
			t.Errorf("%s encodes size %d, Go structure is %d", c.name, got, c.want)
		}
	}
}

func TestStoreImmediateExitTouchesOnlyItsByte(t *testing.T) {
	run := make([]byte, 16)
	run[8] = 0x55 // exit_reason must be untouched
	storeImmediateExit(run, true)
	if run[runOffImmediateExit] != 1 || run[0] != 0 || run[8] != 0x55 {
		t.Fatalf("after set: % x", run[:9])
	}
	storeImmediateExit(run, false)
	if run[runOffImmediateExit] != 0 {
		t.Fatalf("after clear: % x", run[:9])
	}
}
