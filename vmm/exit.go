package vmm

import (
	"fmt"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// ExitKind says why a VM ended.
type ExitKind int

// Why a VM ended.
const (
	// ExitStopped: the host asked (Stop, Close or RequestExit from the host).
	ExitStopped ExitKind = iota
	// ExitReset: the guest asked for a reset (i8042 0xFE, KVM reset event).
	ExitReset
	// ExitPowerOff: the guest powered off (KVM shutdown system event, or a
	// power-off device).
	ExitPowerOff
	// ExitTripleFault: KVM_EXIT_SHUTDOWN, the CPU shut down on a triple fault.
	ExitTripleFault
	// ExitCrash: the guest reported a crash (KVM crash system event).
	ExitCrash
	// ExitInternalError: KVM could not go on (e.g. an emulation failure).
	ExitInternalError
	// ExitFailEntry: the hardware refused to enter the guest.
	ExitFailEntry
	// ExitHalted: a vCPU halted with no in-kernel LAPIC to wake it.
	ExitHalted
	// ExitError: the VMM failed (a KVM_RUN error, an exit it cannot handle).
	ExitError
)

var exitKindNames = [...]string{
	ExitStopped: "stopped", ExitReset: "guest reset", ExitPowerOff: "guest power-off",
	ExitTripleFault: "triple fault", ExitCrash: "guest crash",
	ExitInternalError: "KVM internal error", ExitFailEntry: "VM entry failure",
	ExitHalted: "vCPU halted", ExitError: "VMM error",
}

func (k ExitKind) String() string {
	if k >= 0 && int(k) < len(exitKindNames) {
		return exitKindNames[k]
	}
	return fmt.Sprintf("exit kind %d", int(k))
}

// Exit is why a VM ended. VCPU is the vCPU that ended it, or -1 when the
// host or a device did. Detail is human-readable and may span lines (a KVM
// internal error is printed the way qemu prints it, with registers and code
// bytes). Err carries the underlying error for ExitError.
type Exit struct {
	Kind   ExitKind
	VCPU   int
	Detail string
	Err    error
}

// Clean reports whether the VM ended in an orderly way: stopped by the
// host, or reset or powered off by the guest.
func (e Exit) Clean() bool {
	return e.Kind == ExitStopped || e.Kind == ExitReset || e.Kind == ExitPowerOff
}

func (e Exit) String() string {
	var b strings.Builder
	b.WriteString(e.Kind.String())
	if e.VCPU >= 0 {
		fmt.Fprintf(&b, " on vCPU %d", e.VCPU)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// AsError returns nil for a clean exit and an error describing it otherwise.
func (e Exit) AsError() error {
	if e.Clean() {
		return nil
	}
	if e.Err != nil {
		return fmt.Errorf("VM ended: %s: %w", e.Kind, e.Err)
	}
	return fmt.Errorf("VM ended: %s", e)
}

// formatInternalError renders a KVM_EXIT_INTERNAL_ERROR like qemu:
//
//	KVM internal error. Suberror: 1
//	extra data[0]: 0x…
//	emulation failure
//	RAX=… (registers)
//	Code=… <xx> …
func formatInternalError(ie kvm.InternalError, dump string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "KVM internal error. Suberror: %d\n", ie.Suberror)
	for i, d := range ie.Data {
		fmt.Fprintf(&b, "extra data[%d]: 0x%016x\n", i, d)
	}
	switch ie.Suberror {
	case kvm.InternalErrorEmulation:
		b.WriteString("emulation failure\n")
	case kvm.InternalErrorSimultaneousEx:
		b.WriteString("simultaneous exceptions\n")
	case kvm.InternalErrorDeliveryEvent:
		b.WriteString("failed to deliver an event (exception or interrupt)\n")
	case kvm.InternalErrorUnexpectedExitReason:
		b.WriteString("unexpected hardware exit reason\n")
	}
	if len(ie.Instruction) > 0 {
		fmt.Fprintf(&b, "Instruction bytes: % x\n", ie.Instruction)
	}
	b.WriteString(dump)
	return b.String()
}
