package vmm

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// irqChipIDs are State.IRQChips' chips, in order.
var irqChipIDs = [3]uint32{kvm.IRQChipPICMaster, kvm.IRQChipPICSlave, kvm.IRQChipIOAPIC}

// SaveState reads the state of a paused VM (Pause).
func (v *VM) SaveState() (*State, error) {
	if !v.isPaused() {
		return nil, errors.New("vmm: SaveState needs a paused VM")
	}
	msrs, err := v.sys.GetMSRIndexList()
	if err != nil {
		return nil, err
	}
	s := &State{}
	for _, t := range v.vcpus {
		cs, err := v.saveVCPU(t.vcpu, msrs)
		if err != nil {
			return nil, err
		}
		cs.CPUID = slices.Clone(t.cpuid)
		s.VCPUs = append(s.VCPUs, cs)
	}
	for i, id := range irqChipIDs {
		if s.IRQChips[i], err = v.kvm.GetIRQChip(id); err != nil {
			return nil, err
		}
	}
	if s.PIT, err = v.kvm.GetPIT2(); err != nil {
		return nil, err
	}
	clock, err := v.kvm.GetClock()
	if err != nil {
		return nil, err
	}
	s.ClockNS = clock.Clock
	return s, nil
}

// saveVCPU reads one vCPU's state; msrs are the MSRs KVM lists.
func (v *VM) saveVCPU(c *kvm.VCPU, msrs []uint32) (s VCPUState, err error) {
	if s.Regs, err = c.GetRegs(); err != nil {
		return s, err
	}
	if s.Sregs, err = c.GetSregs(); err != nil {
		return s, err
	}
	if s.FPU, err = c.GetFPU(); err != nil {
		return s, err
	}
	if v.hasCap(kvm.CapXSAVE) {
		if s.XSAVE, err = c.GetXSAVE(); err != nil {
			return s, err
		}
	}
	if v.hasCap(kvm.CapXCRS) {
		x, err := c.GetXCRS()
		if err != nil {
			return s, err
		}
		s.XCRS = &x
	}
	if s.MSRs, err = readableMSRs(c, msrs); err != nil {
		return s, err
	}
	if s.LAPIC, err = c.GetLAPIC(); err != nil {
		return s, err
	}
	if s.MPState, err = c.GetMPState(); err != nil {
		return s, err
	}
	s.Events, err = c.GetVCPUEvents()
	return s, err
}

// hasCap says whether the VM's KVM has capability c.
func (v *VM) hasCap(c kvm.Capability) bool {
	n, err := v.sys.CheckExtension(c)
	return err == nil && n > 0
}

// msrBatch is how many MSRs one KVM_GET_MSRS or KVM_SET_MSRS carries.
const msrBatch = 32

// readableMSRs reads every MSR of indices that the vCPU lets KVM read:
// KVM_GET_MSRS stops at the first it cannot, which is left out (KVM lists
// MSRs a given CPU model lacks).
func readableMSRs(c *kvm.VCPU, indices []uint32) ([]kvm.MSR, error) {
	var out []kvm.MSR
	for len(indices) > 0 {
		batch := indices[:min(len(indices), msrBatch)]
		got, err := c.GetMSRs(batch)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
		skip := len(got)
		if skip < len(batch) {
			skip++ // the unreadable one
		}
		indices = indices[skip:]
	}
	return out, nil
}

// RestoreState gives a fresh VM (New, not started) the state s saved
// from a VM of the same configuration; Start then goes on from it.
func (v *VM) RestoreState(s *State) error {
	if v.isStarted() {
		return errors.New("vmm: RestoreState needs a VM that has not started")
	}
	if len(s.VCPUs) != len(v.vcpus) {
		return fmt.Errorf("vmm: the state has %d vCPUs, this VM %d", len(s.VCPUs), len(v.vcpus))
	}
	for i, t := range v.vcpus {
		if err := sameCPUID(i, s.VCPUs[i].CPUID, t.cpuid); err != nil {
			return err
		}
	}
	if err := v.kvm.SetClock(s.ClockNS); err != nil {
		return err
	}
	for _, chip := range s.IRQChips {
		if err := v.kvm.SetIRQChip(chip); err != nil {
			return err
		}
	}
	if err := v.kvm.SetPIT2(s.PIT); err != nil {
		return err
	}
	for i, t := range v.vcpus {
		if err := restoreVCPU(t.vcpu, &s.VCPUs[i]); err != nil {
			return err
		}
	}
	return nil
}

// sameCPUID checks that vCPU i of a saved state ran with the CPUID table
// the restoring vCPU was given; otherwise the snapshot is of another
// CPU (another policy, or a host whose KVM supports other features):
// snapshot.ErrMismatch, a reason to boot afresh, not damage.
func sameCPUID(i int, saved, now []kvm.CPUIDEntry) error {
	if slices.Equal(saved, now) {
		return nil
	}
	if len(saved) == 0 {
		return fmt.Errorf("vmm: the state of vCPU %d records no CPUID (an older snapshot): %w", i, snapshot.ErrMismatch)
	}
	for j := range min(len(saved), len(now)) {
		if saved[j] != now[j] {
			return fmt.Errorf("vmm: vCPU %d ran with CPUID %s, this VM offers %s: %w",
				i, cpuidString(saved[j]), cpuidString(now[j]), snapshot.ErrMismatch)
		}
	}
	return fmt.Errorf("vmm: vCPU %d ran with %d CPUID entries, this VM offers %d: %w", i, len(saved), len(now), snapshot.ErrMismatch)
}

func cpuidString(e kvm.CPUIDEntry) string {
	return fmt.Sprintf("leaf %#x.%d eax=%#x ebx=%#x ecx=%#x edx=%#x", e.Function, e.Index, e.EAX, e.EBX, e.ECX, e.EDX)
}

// restoreVCPU sets one vCPU's state, in the order Firecracker does (the
// special registers before what depends on paging or the APIC base, the
// events last).
func restoreVCPU(c *kvm.VCPU, s *VCPUState) error {
	if err := c.SetMPState(s.MPState); err != nil {
		return err
	}
	if err := c.SetRegs(s.Regs); err != nil {
		return err
	}
	if err := c.SetSregs(s.Sregs); err != nil {
		return err
	}
	if err := c.SetFPU(s.FPU); err != nil {
		return err
	}
	if s.XSAVE != nil {
		if err := c.SetXSAVE(s.XSAVE); err != nil {
			return err
		}
	}
	if s.XCRS != nil {
		if err := c.SetXCRS(*s.XCRS); err != nil {
			return err
		}
	}
	if err := c.SetLAPIC(s.LAPIC); err != nil {
		return err
	}
	for i := 0; i < len(s.MSRs); i += msrBatch {
		if err := c.SetMSRs(s.MSRs[i:min(len(s.MSRs), i+msrBatch)]); err != nil {
			return err
		}
	}
	return c.SetVCPUEvents(s.Events)
}

// StateSupported says whether SaveState and RestoreState work here.
const StateSupported = true
