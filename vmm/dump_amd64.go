package vmm

import (
	"fmt"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// dumpState renders the vCPU's registers and the code at RIP for an exit
// report; failures to read them are noted, not fatal.
func (v *VM) dumpState(c *kvm.VCPU) string {
	r, err := c.GetRegs()
	if err != nil {
		return fmt.Sprintf("(registers unavailable: %v)\n", err)
	}
	s, err := c.GetSregs()
	if err != nil {
		return fmt.Sprintf("RIP=%016x (special registers unavailable: %v)\n", r.RIP, err)
	}
	code, before := codeAround(v.mem, r, s, 16, 16)
	return formatRegisters(r, s, code, before)
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
