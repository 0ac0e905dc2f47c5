package vmm

import (
	"errors"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// openStats opens vCPU c's statistics for Exits, before it runs (opening
// them later would wait for its KVM_RUN to return: kvm.Stats). A kernel
// without them (before Linux 5.14) gives nil: Exits then says so.
func openStats(c *kvm.VCPU) *kvm.Stats {
	s, err := c.OpenStats()
	if err != nil {
		return nil
	}
	return s
}

// closeStats closes what openStats opened.
func closeStats(stats []*kvm.Stats) {
	for _, s := range stats {
		if s != nil {
			_ = s.Close()
		}
	}
}

// Exits returns the exits KVM counted over every vCPU ("exits"): a count
// that keeps moving while the guest runs — a vCPU busy in guest code leaves
// KVM_RUN at every host timer interrupt, an idle one at its own timer's —
// and stops once the vCPUs have. The helper asks it of a guest whose agent
// is slow to answer, to tell busy from dead. It never waits for a vCPU.
func (v *VM) Exits() (uint64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed { // release closes the stats only once closed is set
		return 0, errors.New("vmm: the vCPUs' exits: the VM is closed")
	}
	var total uint64
	for i, s := range v.kvmStats {
		if s == nil {
			return 0, fmt.Errorf("vmm: vCPU %d has no statistics (KVM_GET_STATS_FD, Linux 5.14)", i)
		}
		counters, err := s.Counters()
		if err != nil {
			return 0, fmt.Errorf("vmm: the vCPUs' exits: %w", err)
		}
		total += counters["exits"]
	}
	return total, nil
}
