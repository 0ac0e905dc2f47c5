package vmm

import "errors"

// ErrStateUnsupported is SaveState's and RestoreState's answer where this
// package cannot yet save a VM: arm64, whose vCPU and GIC state (ONE_REG,
// the vGIC's register groups) it does not read yet. Callers boot instead.
var ErrStateUnsupported = errors.New("vmm: saving a VM's state is not supported on arm64 yet")

// SaveState reads the state of a paused VM: not yet on arm64.
func (v *VM) SaveState() (*State, error) { return nil, ErrStateUnsupported }

// RestoreState gives a fresh VM a saved state: not yet on arm64.
func (v *VM) RestoreState(*State) error { return ErrStateUnsupported }

// StateSupported says whether SaveState and RestoreState work here.
const StateSupported = false
