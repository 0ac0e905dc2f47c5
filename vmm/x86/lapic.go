package x86

import (
	"encoding/binary"
	"fmt"
)

// LAPICRegsSize is the size of KVM's struct kvm_lapic_state register page.
const LAPICRegsSize = 1024

// Offsets of the local vector table's LINT registers in the LAPIC page.
const (
	LAPICLVTLINT0 = 0x350
	LAPICLVTLINT1 = 0x360
)

// LAPIC delivery modes (LVT bits 8..10).
const (
	lapicDeliveryNMI    = 0x4
	lapicDeliveryExtINT = 0x7
)

// SetLAPICLINTs edits a vCPU's LAPIC register page (from KVM_GET_LAPIC, to
// be written back with KVM_SET_LAPIC) so LINT0 delivers ExtINT (the 8259)
// and LINT1 delivers NMI, matching the MP table's local interrupt entries,
// as a PC's firmware leaves them (Firecracker's set_lint).
func SetLAPICLINTs(regs []byte) error {
	if len(regs) < LAPICRegsSize {
		return fmt.Errorf("LAPIC register page of %d bytes, want %d", len(regs), LAPICRegsSize)
	}
	le := binary.LittleEndian
	set := func(off int, mode uint32) {
		v := le.Uint32(regs[off:])
		le.PutUint32(regs[off:], v&^0x700|mode<<8)
	}
	set(LAPICLVTLINT0, lapicDeliveryExtINT)
	set(LAPICLVTLINT1, lapicDeliveryNMI)
	return nil
}
