package vmm

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// CPUIDContext is what a CPUID policy knows about the vCPU and the host.
type CPUIDContext struct {
	// CPU is the vCPU's index, also its APIC ID; CPUs the vCPU count.
	CPU, CPUs int
	// PVM: the host KVM is PVM, whose emulator cannot run CX16 or XSAVE.
	PVM bool
	// TSCDeadlineTimer: KVM emulates the LAPIC TSC-deadline timer.
	TSCDeadlineTimer bool
}

// CPUIDPolicy builds the CPUID table of one vCPU from the leaves KVM
// supports (KVM_GET_SUPPORTED_CPUID). It must not modify supported.
type CPUIDPolicy func(supported []kvm.CPUIDEntry, ctx CPUIDContext) ([]kvm.CPUIDEntry, error)

// LinuxCPUID is the default CPUIDPolicy: vmm/x86's CPUIDForVCPU (topology,
// hypervisor leaves, masking what KVM or PVM cannot offer).
func LinuxCPUID(supported []kvm.CPUIDEntry, ctx CPUIDContext) ([]kvm.CPUIDEntry, error) {
	in := make([]x86.CPUIDEntry, len(supported))
	for i, e := range supported {
		in[i] = x86.CPUIDEntry{Function: e.Function, Index: e.Index, Flags: e.Flags,
			EAX: e.EAX, EBX: e.EBX, ECX: e.ECX, EDX: e.EDX}
	}
	out, err := x86.CPUIDForVCPU(in, x86.CPUIDPolicy{
		VCPUIndex: ctx.CPU, CPUCount: ctx.CPUs, PVM: ctx.PVM, TSCDeadlineTimer: ctx.TSCDeadlineTimer,
	})
	if err != nil {
		return nil, err
	}
	entries := make([]kvm.CPUIDEntry, len(out))
	for i, e := range out {
		entries[i] = kvm.CPUIDEntry{Function: e.Function, Index: e.Index, Flags: e.Flags,
			EAX: e.EAX, EBX: e.EBX, ECX: e.ECX, EDX: e.EDX}
	}
	return entries, nil
}

// bootMSRs converts vmm/x86's boot MSRs for KVM_SET_MSRS.
func bootMSRs() []kvm.MSR {
	in := x86.BootMSRs()
	out := make([]kvm.MSR, len(in))
	for i, m := range in {
		out[i] = kvm.MSR{Index: m.Index, Data: m.Value}
	}
	return out
}

// kvmSegment converts a vmm/x86 segment to KVM's.
func kvmSegment(s x86.Segment) kvm.Segment {
	return kvm.Segment{Base: s.Base, Limit: s.Limit, Selector: s.Selector, Type: s.Type,
		Present: s.Present, DPL: s.DPL, DB: s.DB, S: s.S, L: s.L, G: s.G, AVL: s.AVL, Unusable: s.Unusable}
}

// applySystemRegisters overwrites the boot fields of sregs, leaving APIC
// base, CR2, CR8 and the interrupt bitmap as KVM has them.
func applySystemRegisters(sregs *kvm.Sregs, b x86.SystemRegisters) {
	sregs.CS, sregs.DS, sregs.ES = kvmSegment(b.CS), kvmSegment(b.DS), kvmSegment(b.ES)
	sregs.FS, sregs.GS, sregs.SS = kvmSegment(b.FS), kvmSegment(b.GS), kvmSegment(b.SS)
	sregs.TR, sregs.LDT = kvmSegment(b.TR), kvmSegment(b.LDT)
	sregs.GDT = kvm.DTable{Base: b.GDT.Base, Limit: b.GDT.Limit}
	sregs.IDT = kvm.DTable{Base: b.IDT.Base, Limit: b.IDT.Limit}
	sregs.CR0, sregs.CR3, sregs.CR4, sregs.EFER = b.CR0, b.CR3, b.CR4, b.EFER
}

// SetBootRegisters loads the registers vmm/loader's PrepareBoot computed
// into vCPU cpu (normally 0, the boot CPU) before Start.
func (v *VM) SetBootRegisters(cpu int, regs x86.Registers, sregs x86.SystemRegisters) error {
	c := v.VCPU(cpu)
	if c == nil {
		return fmt.Errorf("vmm: no vCPU %d", cpu)
	}
	s, err := c.GetSregs()
	if err != nil {
		return err
	}
	applySystemRegisters(&s, sregs)
	if err := c.SetSregs(s); err != nil {
		return err
	}
	return c.SetRegs(kvm.Regs(regs))
}
