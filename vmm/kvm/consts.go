package kvm

import (
	"runtime"
	"slices"
)

// ioctl request numbers, from <linux/kvm.h> (x86-64; the arm64 ones are in
// armvcpu.go and armdevice.go). The layout test checks
// the sizes encoded in them against the Go structures.
const (
	ioctlGetAPIVersion       = 0xae00
	ioctlCreateVM            = 0xae01
	ioctlGetMSRIndexList     = 0xc004ae02
	ioctlCheckExtension      = 0xae03
	ioctlGetVCPUMmapSize     = 0xae04
	ioctlGetSupportedCPUID   = 0xc008ae05
	ioctlCreateVCPU          = 0xae41
	ioctlSetUserMemoryRegion = 0x4020ae46
	ioctlSetTSSAddr          = 0xae47
	ioctlSetIdentityMapAddr  = 0x4008ae48
	ioctlCreateIRQChip       = 0xae60
	ioctlIRQLine             = 0x4008ae61
	ioctlSetGSIRouting       = 0x4008ae6a
	ioctlIRQFD               = 0x4020ae76
	ioctlCreatePIT2          = 0x4040ae77
	ioctlIOEventFD           = 0x4040ae79
	ioctlRun                 = 0xae80
	ioctlGetRegs             = 0x8090ae81
	ioctlSetRegs             = 0x4090ae82
	ioctlGetSregs            = 0x8138ae83
	ioctlSetSregs            = 0x4138ae84
	ioctlGetMSRs             = 0xc008ae88
	ioctlSetMSRs             = 0x4008ae89
	ioctlSetSignalMask       = 0x4004ae8b
	ioctlGetFPU              = 0x81a0ae8c
	ioctlSetFPU              = 0x41a0ae8d
	ioctlGetLAPIC            = 0x8400ae8e
	ioctlSetLAPIC            = 0x4400ae8f
	ioctlSetCPUID2           = 0x4008ae90
	ioctlGetMPState          = 0x8004ae98
	ioctlSetMPState          = 0x4004ae99
)

// APIVersion is the only KVM API version this package speaks; every kernel
// since 2.6.22 reports it.
const APIVersion = 12

// Capability is a KVM_CAP_* number, for CheckExtension.
type Capability uint32

// Capabilities this project uses.
const (
	CapIRQChip            Capability = 0
	CapHLT                Capability = 1
	CapUserMemory         Capability = 3
	CapSetTSSAddr         Capability = 4
	CapExtCPUID           Capability = 7
	CapNrVCPUs            Capability = 9
	CapMPState            Capability = 14
	CapSyncMMU            Capability = 16
	CapIRQRouting         Capability = 25
	CapIRQFD              Capability = 32
	CapPIT2               Capability = 33
	CapIOEventFD          Capability = 36
	CapSetIdentityMapAddr Capability = 37
	CapAdjustClock        Capability = 39
	CapVCPUEvents         Capability = 41
	CapXSAVE              Capability = 55
	CapXCRS               Capability = 56
	CapMaxVCPUs           Capability = 66
	CapTSCDeadlineTimer   Capability = 72
	CapSplitIRQChip       Capability = 121
	CapX2APICAPI          Capability = 129
	CapImmediateExit      Capability = 136

	CapOneReg         Capability = 70
	CapReadonlyMem    Capability = 81
	CapARMPSCI        Capability = 87
	CapDeviceCtrl     Capability = 89
	CapARMPSCI02      Capability = 102
	CapARMPMUv3       Capability = 126
	CapVCPUAttributes Capability = 127
	CapARMVMIPASize   Capability = 165
	CapARMSVE         Capability = 170
)

var capabilityNames = map[Capability]string{
	CapIRQChip:            "KVM_CAP_IRQCHIP",
	CapHLT:                "KVM_CAP_HLT",
	CapUserMemory:         "KVM_CAP_USER_MEMORY",
	CapSetTSSAddr:         "KVM_CAP_SET_TSS_ADDR",
	CapExtCPUID:           "KVM_CAP_EXT_CPUID",
	CapNrVCPUs:            "KVM_CAP_NR_VCPUS",
	CapMPState:            "KVM_CAP_MP_STATE",
	CapSyncMMU:            "KVM_CAP_SYNC_MMU",
	CapIRQRouting:         "KVM_CAP_IRQ_ROUTING",
	CapIRQFD:              "KVM_CAP_IRQFD",
	CapPIT2:               "KVM_CAP_PIT2",
	CapIOEventFD:          "KVM_CAP_IOEVENTFD",
	CapSetIdentityMapAddr: "KVM_CAP_SET_IDENTITY_MAP_ADDR",
	CapAdjustClock:        "KVM_CAP_ADJUST_CLOCK",
	CapVCPUEvents:         "KVM_CAP_VCPU_EVENTS",
	CapXSAVE:              "KVM_CAP_XSAVE",
	CapXCRS:               "KVM_CAP_XCRS",
	CapMaxVCPUs:           "KVM_CAP_MAX_VCPUS",
	CapTSCDeadlineTimer:   "KVM_CAP_TSC_DEADLINE_TIMER",
	CapSplitIRQChip:       "KVM_CAP_SPLIT_IRQCHIP",
	CapX2APICAPI:          "KVM_CAP_X2APIC_API",
	CapImmediateExit:      "KVM_CAP_IMMEDIATE_EXIT",
	CapOneReg:             "KVM_CAP_ONE_REG",
	CapReadonlyMem:        "KVM_CAP_READONLY_MEM",
	CapARMPSCI:            "KVM_CAP_ARM_PSCI",
	CapDeviceCtrl:         "KVM_CAP_DEVICE_CTRL",
	CapARMPSCI02:          "KVM_CAP_ARM_PSCI_0_2",
	CapARMPMUv3:           "KVM_CAP_ARM_PMU_V3",
	CapVCPUAttributes:     "KVM_CAP_VCPU_ATTRIBUTES",
	CapARMVMIPASize:       "KVM_CAP_ARM_VM_IPA_SIZE",
	CapARMSVE:             "KVM_CAP_ARM_SVE",
}

// String returns the kernel's name for the capability (KVM_CAP_…).
func (c Capability) String() string {
	if n, ok := capabilityNames[c]; ok {
		return n
	}
	return "KVM_CAP_" + itoa(uint64(c))
}

// RequiredCapabilities are the capabilities the VMM cannot work without on
// the architecture it was built for: RequiredCapabilitiesFor(runtime.GOARCH).
var RequiredCapabilities = RequiredCapabilitiesFor(runtime.GOARCH)

// RequiredCapabilitiesFor lists the capabilities the VMM needs of a KVM on
// goarch, nil for an architecture it does not support.
//
// On amd64: an in-kernel irqchip and PIT, user memory, the TSS and
// identity-map addresses Intel needs for real mode, extended CPUID, MP
// state (to start APs), irqfd interrupt lines and immediate_exit (to kick
// a vCPU out of KVM_RUN).
//
// On arm64, only capabilities arm64 KVM reports (6.1's
// kvm_vm_ioctl_check_extension and the generic ones): user memory, irqfd
// and ioeventfd, immediate_exit, ONE_REG (every register goes through
// it), DEVICE_CTRL (the GICv3 is a device), PSCI 0.2 (secondary vCPUs
// start through CPU_ON) and IRQCHIP, which arm64 reports when it can
// emulate a GIC (KVM_IRQ_LINE then reaches it).
func RequiredCapabilitiesFor(goarch string) []Capability {
	switch goarch {
	case "amd64":
		return []Capability{
			CapIRQChip, CapUserMemory, CapSetTSSAddr, CapSetIdentityMapAddr,
			CapExtCPUID, CapPIT2, CapMPState, CapIRQFD, CapImmediateExit,
		}
	case "arm64":
		return []Capability{
			CapIRQChip, CapUserMemory, CapIRQFD, CapIOEventFD, CapImmediateExit,
			CapOneReg, CapDeviceCtrl, CapARMPSCI02,
		}
	}
	return nil
}

// supportedArch says whether the VMM runs guests on goarch's KVM.
func supportedArch(goarch string) bool {
	return slices.Contains([]string{"amd64", "arm64"}, goarch)
}

// ExitReason is kvm_run.exit_reason (KVM_EXIT_*).
type ExitReason uint32

// Exit reasons handled by the VMM.
const (
	ExitUnknown       ExitReason = 0
	ExitException     ExitReason = 1
	ExitIO            ExitReason = 2
	ExitHypercall     ExitReason = 3
	ExitDebug         ExitReason = 4
	ExitHLT           ExitReason = 5
	ExitMMIO          ExitReason = 6
	ExitIRQWindowOpen ExitReason = 7
	ExitShutdown      ExitReason = 8
	ExitFailEntry     ExitReason = 9
	ExitIntr          ExitReason = 10
	ExitNMI           ExitReason = 16
	ExitInternalError ExitReason = 17
	ExitSystemEvent   ExitReason = 24
)

var exitReasonNames = map[ExitReason]string{
	ExitUnknown: "KVM_EXIT_UNKNOWN", ExitException: "KVM_EXIT_EXCEPTION",
	ExitIO: "KVM_EXIT_IO", ExitHypercall: "KVM_EXIT_HYPERCALL",
	ExitDebug: "KVM_EXIT_DEBUG", ExitHLT: "KVM_EXIT_HLT", ExitMMIO: "KVM_EXIT_MMIO",
	ExitIRQWindowOpen: "KVM_EXIT_IRQ_WINDOW_OPEN", ExitShutdown: "KVM_EXIT_SHUTDOWN",
	ExitFailEntry: "KVM_EXIT_FAIL_ENTRY", ExitIntr: "KVM_EXIT_INTR", ExitNMI: "KVM_EXIT_NMI",
	ExitInternalError: "KVM_EXIT_INTERNAL_ERROR", ExitSystemEvent: "KVM_EXIT_SYSTEM_EVENT",
}

// String returns the kernel's name for the exit reason.
func (r ExitReason) String() string {
	if n, ok := exitReasonNames[r]; ok {
		return n
	}
	return "KVM_EXIT_" + itoa(uint64(r))
}

// System event types (kvm_run.system_event.type).
const (
	SystemEventShutdown = 1
	SystemEventReset    = 2
	SystemEventCrash    = 3
)

// Internal error suberrors (kvm_run.internal.suberror).
const (
	InternalErrorEmulation            = 1
	InternalErrorSimultaneousEx       = 2
	InternalErrorDeliveryEvent        = 3
	InternalErrorUnexpectedExitReason = 4
)

// emulationFlagInstructionBytes marks kvm_run.emulation_failure.insn_bytes valid.
const emulationFlagInstructionBytes = 1

// I/O directions (kvm_run.io.direction).
const (
	IODirectionIn  = 0
	IODirectionOut = 1
)

// MPState is a vCPU's multiprocessing state (KVM_MP_STATE_*).
type MPState uint32

// MP states.
const (
	MPStateRunnable      MPState = 0
	MPStateUninitialized MPState = 1
	MPStateInitReceived  MPState = 2
	MPStateHalted        MPState = 3
	MPStateSIPIReceived  MPState = 4
	// MPStateStopped is a powered-off arm64 vCPU (never started, or PSCI
	// CPU_OFF).
	MPStateStopped MPState = 5
	// MPStateSuspended is an arm64 vCPU in PSCI SYSTEM_SUSPEND's WFI.
	MPStateSuspended MPState = 9
)

// Flags for IRQFD and IOEventFD.
const (
	irqfdFlagDeassign        = 1
	ioeventfdFlagDatamatch   = 1
	ioeventfdFlagPIO         = 2
	ioeventfdFlagDeassign    = 4
	pitSpeakerDummy          = 1
	maxSupportedCPUIDEntries = 4096
)

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}
