package kvm

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// The trial guest: a few instructions in 32-bit protected mode that do what
// every Linux kernel's boot does and a paravirtual KVM's instruction
// emulator cannot (HOST-FACTS: PVM executes guest kernel code in KVM's
// emulator, which has no software interrupts in protected mode; Linux runs
// int3 in its alternatives self-test). It raises int3 through an IDT gate,
// the handler writes 1 to trialPort and returns with iret, and the main
// code writes 2. A hardware-assisted KVM gives exactly those two port
// exits; PVM gives an emulation failure.
//
// Guest-physical layout of its one 64 KiB region, everything else hlt:
const (
	trialGDT      = 0x0000 // null, code (0x08), data (0x10)
	trialIDT      = 0x0100 // gates 0..3; int3's points at trialHandler
	trialCode     = 0x1000
	trialHandler  = 0x1100
	trialStack    = 0x8000
	trialMemSize  = 0x10000
	trialPort     = 0xe9
	trialMaxExits = 16
)

var (
	// int3; mov al, 2; out 0xe9, al; hlt
	trialMainCode = []byte{0xcc, 0xb0, 0x02, 0xe6, trialPort, 0xf4}
	// mov al, 1; out 0xe9, al; iretd
	trialHandlerCode = []byte{0xb0, 0x01, 0xe6, trialPort, 0xcf}
)

// errTrialEmulation is the trial's failure on a KVM that emulates guest
// kernel code and cannot run int3 there.
var errTrialEmulation = errors.New("its instruction emulator cannot execute int3 in protected mode, which every Linux kernel runs at boot")

// trialGuest runs the trial guest on a fresh VM of sys and reports how it
// differed from a hardware-assisted KVM, or nil.
func trialGuest(sys *System) error {
	vm, err := sys.CreateVM()
	if err != nil {
		return fmt.Errorf("trial guest: %w", err)
	}
	defer vm.Close()
	mem, err := unix.Mmap(-1, 0, trialMemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("trial guest: mmap: %w", err)
	}
	defer unix.Munmap(mem)
	layoutTrialMemory(mem)
	region := UserspaceMemoryRegion{MemorySize: trialMemSize, UserspaceAddr: sliceAddress(mem)}
	if err := vm.SetUserMemoryRegion(region); err != nil {
		return fmt.Errorf("trial guest: %w", err)
	}
	vcpu, err := vm.CreateVCPU(0)
	if err != nil {
		return fmt.Errorf("trial guest: %w", err)
	}
	defer vcpu.Close()
	if err := enterTrialProtectedMode(vcpu); err != nil {
		return fmt.Errorf("trial guest: %w", err)
	}
	return runTrial(vcpu)
}

// layoutTrialMemory writes the GDT, IDT and code into mem, hlt elsewhere
// so a stray jump ends in an exit rather than a spin.
func layoutTrialMemory(mem []byte) {
	for i := range mem {
		mem[i] = 0xf4
	}
	le := binary.LittleEndian
	le.PutUint64(mem[trialGDT:], 0)
	le.PutUint64(mem[trialGDT+8:], 0x00cf9b000000ffff)  // code: base 0, 4 GiB, 32-bit, present
	le.PutUint64(mem[trialGDT+16:], 0x00cf93000000ffff) // data: base 0, 4 GiB, writable
	for vector := range 4 {
		gate := mem[trialIDT+8*vector:]
		le.PutUint16(gate[0:], uint16(trialHandler&0xffff))
		le.PutUint16(gate[2:], 0x08) // code selector
		gate[4] = 0
		gate[5] = 0x8e // present, DPL 0, 32-bit interrupt gate
		le.PutUint16(gate[6:], uint16(trialHandler>>16))
	}
	copy(mem[trialCode:], trialMainCode)
	copy(mem[trialHandler:], trialHandlerCode)
}

// enterTrialProtectedMode sets flat 32-bit protected-mode segments and the
// descriptor tables, without paging.
func enterTrialProtectedMode(c *VCPU) error {
	s, err := c.GetSregs()
	if err != nil {
		return err
	}
	code := Segment{Limit: 0xffffffff, Selector: 0x08, Type: 0xb, Present: 1, DB: 1, S: 1, G: 1}
	data := Segment{Limit: 0xffffffff, Selector: 0x10, Type: 0x3, Present: 1, DB: 1, S: 1, G: 1}
	s.CS = code
	s.DS, s.ES, s.FS, s.GS, s.SS = data, data, data, data, data
	s.TR = Segment{Limit: 0x67, Type: 0xb, Present: 1}
	s.LDT = Segment{Unusable: 1}
	s.GDT = DTable{Base: trialGDT, Limit: 3*8 - 1}
	s.IDT = DTable{Base: trialIDT, Limit: 4*8 - 1}
	s.CR0 = 0x11 // PE, ET
	s.CR4, s.EFER = 0, 0
	if err := c.SetSregs(s); err != nil {
		return err
	}
	return c.SetRegs(Regs{RIP: trialCode, RSP: trialStack, RFLAGS: 2})
}

// runTrial runs the vCPU until the trial's two port writes, or says what
// happened instead.
func runTrial(c *VCPU) error {
	var wrote []byte
	for range trialMaxExits {
		if err := c.Run(); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("trial guest: KVM_RUN: %w", err)
		}
		switch reason := c.ExitReason(); reason {
		case ExitIO:
			io, err := c.IO()
			if err != nil {
				return fmt.Errorf("trial guest: %w", err)
			}
			if !io.Out || io.Port != trialPort || len(io.Data) != 1 {
				return fmt.Errorf("trial guest: unexpected port access %+v", io)
			}
			if wrote = append(wrote, io.Data[0]); len(wrote) == 2 {
				return checkTrialWrites(wrote)
			}
		case ExitInternalError:
			e := c.Internal()
			return fmt.Errorf("%w (KVM internal error, suberror %d, instruction % x)", errTrialEmulation, e.Suberror, e.Instruction)
		default:
			return fmt.Errorf("trial guest: exit %v after port writes %v; a hardware-assisted KVM gives the writes 1, 2", reason, wrote)
		}
	}
	return fmt.Errorf("trial guest: no result after %d exits (port writes %v)", trialMaxExits, wrote)
}

func checkTrialWrites(wrote []byte) error {
	if wrote[0] != 1 || wrote[1] != 2 {
		return fmt.Errorf("trial guest: port writes %v, want 1 (the int3 handler) then 2", wrote)
	}
	return nil
}
