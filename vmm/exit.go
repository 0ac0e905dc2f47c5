package vmm

import (
	"fmt"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
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

// formatRegisters renders registers like qemu's cpu_dump_state, followed by
// the code bytes around RIP when they can be read ("Code=… <xx> …").
func formatRegisters(r kvm.Regs, s kvm.Sregs, code []byte, codeBefore int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "RAX=%016x RBX=%016x RCX=%016x RDX=%016x\n", r.RAX, r.RBX, r.RCX, r.RDX)
	fmt.Fprintf(&b, "RSI=%016x RDI=%016x RBP=%016x RSP=%016x\n", r.RSI, r.RDI, r.RBP, r.RSP)
	fmt.Fprintf(&b, "R8 =%016x R9 =%016x R10=%016x R11=%016x\n", r.R8, r.R9, r.R10, r.R11)
	fmt.Fprintf(&b, "R12=%016x R13=%016x R14=%016x R15=%016x\n", r.R12, r.R13, r.R14, r.R15)
	fmt.Fprintf(&b, "RIP=%016x RFL=%08x\n", r.RIP, r.RFLAGS)
	seg := func(name string, g kvm.Segment) {
		fmt.Fprintf(&b, "%-3s=%04x %016x %08x type=%x dpl=%d p=%d s=%d l=%d db=%d g=%d\n",
			name, g.Selector, g.Base, g.Limit, g.Type, g.DPL, g.Present, g.S, g.L, g.DB, g.G)
	}
	seg("ES", s.ES)
	seg("CS", s.CS)
	seg("SS", s.SS)
	seg("DS", s.DS)
	seg("FS", s.FS)
	seg("GS", s.GS)
	seg("LDT", s.LDT)
	seg("TR", s.TR)
	fmt.Fprintf(&b, "GDT=     %016x %08x\n", s.GDT.Base, s.GDT.Limit)
	fmt.Fprintf(&b, "IDT=     %016x %08x\n", s.IDT.Base, s.IDT.Limit)
	fmt.Fprintf(&b, "CR0=%08x CR2=%016x CR3=%016x CR4=%08x\n", s.CR0, s.CR2, s.CR3, s.CR4)
	fmt.Fprintf(&b, "EFER=%016x APIC_BASE=%016x\n", s.EFER, s.APICBase)
	if len(code) > 0 {
		b.WriteString("Code=")
		for i, c := range code {
			if i > 0 {
				b.WriteByte(' ')
			}
			if i == codeBefore {
				fmt.Fprintf(&b, "<%02x>", c)
			} else {
				fmt.Fprintf(&b, "%02x", c)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// codeAround reads up to before bytes before RIP and after bytes from it,
// in guest memory; it returns nil when RIP does not translate to RAM.
func codeAround(mem *Memory, r kvm.Regs, s kvm.Sregs, before, after int) ([]byte, int) {
	linear := s.CS.Base + r.RIP
	if s.EFER&x86.EFERLongModeActive != 0 && s.CS.L != 0 {
		linear = r.RIP
	}
	paging := x86.Paging{CR0: s.CR0, CR3: s.CR3, CR4: s.CR4, EFER: s.EFER}
	for b := before; b >= 0; b -= before {
		start := linear - uint64(b)
		gpa, ok := paging.Translate(mem, start)
		if ok {
			code := make([]byte, b+after)
			if mem.ReadAt(code, gpa) == nil {
				return code, b
			}
		}
		if b == 0 {
			break
		}
	}
	return nil, 0
}
