package x86

// MSR is one model-specific register value for KVM_SET_MSRS.
type MSR struct {
	Index uint32
	Value uint64
}

// MSR indices set at boot.
const (
	MSRIA32SysenterCS  uint32 = 0x174
	MSRIA32SysenterESP uint32 = 0x175
	MSRIA32SysenterEIP uint32 = 0x176
	MSRIA32TSC         uint32 = 0x10
	MSRIA32MiscEnable  uint32 = 0x1a0
	MSRMTRRDefType     uint32 = 0x2ff
	MSRSTAR            uint32 = 0xc0000081
	MSRLSTAR           uint32 = 0xc0000082
	MSRCSTAR           uint32 = 0xc0000083
	MSRSyscallMask     uint32 = 0xc0000084
	MSRKernelGSBase    uint32 = 0xc0000102
)

// Values of the boot MSRs.
const (
	// MiscEnableFastStrings enables fast REP MOVS/STOS, as firmware does.
	MiscEnableFastStrings uint64 = 1 << 0
	// MTRRDefTypeEnable turns MTRRs on; MTRRTypeWriteBack is the default
	// memory type. Without it, all memory would be uncached to the guest.
	MTRRDefTypeEnable uint64 = 1 << 11
	MTRRTypeWriteBack uint64 = 6
)

// BootMSRs returns the MSRs every vCPU gets before its first run, as
// Firecracker's create_boot_msr_entries: the SYSENTER and SYSCALL MSRs and
// KERNEL_GS_BASE cleared (the kernel sets them; a reused vCPU must not keep
// stale entry points), TSC 0 (KVM keeps the vCPUs' TSCs in sync when they
// are written close together), fast strings on, and MTRRs enabled with
// write-back as the default type.
//
// KVM_SET_MSRS returns how many entries it set; the VMM must treat a short
// count as an error naming BootMSRs()[count].Index.
func BootMSRs() []MSR {
	return []MSR{
		{Index: MSRIA32SysenterCS},
		{Index: MSRIA32SysenterESP},
		{Index: MSRIA32SysenterEIP},
		{Index: MSRSTAR},
		{Index: MSRCSTAR},
		{Index: MSRKernelGSBase},
		{Index: MSRSyscallMask},
		{Index: MSRLSTAR},
		{Index: MSRIA32TSC},
		{Index: MSRIA32MiscEnable, Value: MiscEnableFastStrings},
		{Index: MSRMTRRDefType, Value: MTRRDefTypeEnable | MTRRTypeWriteBack},
	}
}
