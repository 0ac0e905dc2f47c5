package machine

import "github.com/cowork-vmm/cowork-vmm/vmm/arm64"

// wantIRQChip is the interrupt controller the guest must report driving
// (testinit's IRQCHIP line): the GIC the VM created, by the chip name
// Linux gives it (its GICv2 driver calls the first GIC "GIC-0").
func wantIRQChip(m *Machine) string {
	if m.vm.GIC() == arm64.GICv2 {
		return "GIC-0"
	}
	return "GICv3"
}
