package vmm

import (
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// State is what KVM holds of a paused VM, enough for a fresh VM of the
// same configuration on the same kind of host to go on where this one
// stopped. On x86: each vCPU's registers, FPU/SIMD state, MSRs, local
// APIC, run state and pending events; the in-kernel PIC pair, IOAPIC and
// PIT; the KVM clock. On arm64 all of it is in ARM64 (the x86 fields stay
// zero). Guest memory and device state are not in it.
type State struct {
	VCPUs []VCPUState
	// IRQChips are the master PIC, the slave PIC and the IOAPIC, in that
	// order.
	IRQChips [3]kvm.IRQChip
	PIT      kvm.PITState
	// ClockNS is the KVM clock (kvmclock's time) when the VM paused.
	ClockNS uint64
	// ARM64 is an arm64 VM's state; nil on x86 (and in older snapshots,
	// which gob decodes without it).
	ARM64 *ARM64State
}

// VCPUState is one vCPU's part of State. XSAVE and XCRS are nil on a KVM
// without KVM_CAP_XSAVE or KVM_CAP_XCRS (FPU then holds the SIMD state).
type VCPUState struct {
	// CPUID is the table the vCPU ran with. The guest chose its code paths
	// and XSAVE layout by it (AVX-512 or not, XCR0), so the state restores
	// only into a vCPU given the same table: the same policy on a host
	// whose KVM supports the same features.
	CPUID   []kvm.CPUIDEntry
	Regs    kvm.Regs
	Sregs   kvm.Sregs
	FPU     kvm.FPU
	XSAVE   *kvm.XSAVE
	XCRS    *kvm.XCRS
	MSRs    []kvm.MSR
	LAPIC   kvm.LAPICState
	MPState kvm.MPState
	Events  kvm.VCPUEvents
}
