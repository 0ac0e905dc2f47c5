package vmm

import (
	"errors"

	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
)

// SaveState reads the state of a paused VM (Pause): State.ARM64, each
// vCPU's registers and the GIC (saveARM64).
func (v *VM) SaveState() (*State, error) {
	if !v.isPaused() {
		return nil, errors.New("vmm: SaveState needs a paused VM")
	}
	s, err := saveARM64(v.armVCPUs(), v.arch.gic, v.arch.gicKind, arm64.GICIRQs)
	if err != nil {
		return nil, err
	}
	return &State{ARM64: s}, nil
}

// RestoreState gives a fresh VM (New, not started) the state s saved
// from a VM of the same configuration; Start then goes on from it. The
// virtual counter goes on from where the saved VM's stopped: the guest
// sees no time pass while it was saved.
func (v *VM) RestoreState(s *State) error {
	if v.isStarted() {
		return errors.New("vmm: RestoreState needs a VM that has not started")
	}
	return restoreARM64(v.armVCPUs(), v.arch.gic, v.arch.gicKind, arm64.GICIRQs, s.ARM64)
}

// armVCPUs are the VM's vCPUs, in index order.
func (v *VM) armVCPUs() []armVCPU {
	out := make([]armVCPU, len(v.vcpus))
	for i, t := range v.vcpus {
		out[i] = t.vcpu
	}
	return out
}

// StateSupported says whether SaveState and RestoreState work here.
const StateSupported = true
