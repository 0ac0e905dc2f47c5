package vmm

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// SetBootEntry loads the arm64 Linux boot protocol's registers into vCPU
// cpu (the boot CPU, 0) before Start: PC at the kernel's entry, x0 the
// device tree's address, x1-x3 zero, EL1h with every exception masked.
func (v *VM) SetBootEntry(cpu int, entry, dtb uint64) error {
	c := v.VCPU(cpu)
	if c == nil {
		return fmt.Errorf("vmm: no vCPU %d", cpu)
	}
	regs := []struct{ id, val uint64 }{
		{kvm.ARM64RegPSTATE, arm64.BootPSTATE},
		{kvm.ARM64RegX(0), dtb},
		{kvm.ARM64RegX(1), 0},
		{kvm.ARM64RegX(2), 0},
		{kvm.ARM64RegX(3), 0},
		{kvm.ARM64RegPC, entry},
	}
	for _, r := range regs {
		if err := c.SetOneReg(r.id, r.val); err != nil {
			return fmt.Errorf("vmm: vCPU %d register %#x: %w", cpu, r.id, err)
		}
	}
	return nil
}
