package vmm

import (
	"fmt"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// dumpState renders the vCPU's core registers for an exit report, qemu's
// aarch64 layout; failures to read them are noted, not fatal.
func (v *VM) dumpState(c *kvm.VCPU) string {
	var b strings.Builder
	read := func(id uint64) uint64 {
		val, err := c.GetOneReg(id)
		if err != nil {
			fmt.Fprintf(&b, "(register %#x unavailable: %v)\n", id, err)
		}
		return val
	}
	pc, pstate, sp := read(kvm.ARM64RegPC), read(kvm.ARM64RegPSTATE), read(kvm.ARM64RegSP)
	fmt.Fprintf(&b, "PC=%016x SP=%016x PSTATE=%08x (EL%d)\n", pc, sp, pstate, (pstate>>2)&3)
	for i := 0; i < 31; i++ {
		fmt.Fprintf(&b, "X%02d=%016x", i, read(kvm.ARM64RegX(i)))
		if i%4 == 3 || i == 30 {
			b.WriteByte('\n')
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()
}
