package kvm

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// VCPU is one virtual CPU: its fd and its mapped kvm_run area. Run and the
// exit accessors must be called from the single goroutine that runs it;
// RequestImmediateExit may be called from any goroutine.
type VCPU struct {
	fd  int
	id  int
	run []byte
}

// ID returns the vCPU's id (on x86 its initial APIC ID).
func (c *VCPU) ID() int { return c.id }

// Close unmaps kvm_run and closes the vCPU fd.
func (c *VCPU) Close() error {
	if c == nil || c.fd < 0 {
		return nil
	}
	var firstErr error
	if c.run != nil {
		if err := unix.Munmap(c.run); err != nil {
			firstErr = fmt.Errorf("munmap kvm_run of vCPU %d: %w", c.id, err)
		}
		c.run = nil
	}
	if err := unix.Close(c.fd); err != nil && firstErr == nil {
		firstErr = err
	}
	c.fd = -1
	return firstErr
}

// Run issues KVM_RUN once. It returns unix.EINTR when a signal or
// immediate_exit kicked the vCPU, and nil when the guest exited with a
// reason to handle (ExitReason and the exit accessors describe it).
func (c *VCPU) Run() error {
	return runOnce(c.fd)
}

// signalMaskArg mirrors struct kvm_signal_mask with the kernel's 64-bit
// sigset, which follows len at byte 4 (hence bytes, not a uint64).
type signalMaskArg struct {
	Len    uint32
	Sigset [8]byte
}

// SetGuestSignals issues KVM_SET_SIGNAL_MASK so that, while this vCPU runs
// the guest (inside KVM_RUN), only the signals in allowed (1-based numbers)
// can interrupt it; the others stay pending until KVM_RUN returns, when the
// thread's own mask applies again.
func (c *VCPU) SetGuestSignals(allowed ...unix.Signal) error {
	blocked := ^uint64(0)
	for _, sig := range allowed {
		if sig < 1 || sig > 64 {
			return fmt.Errorf("KVM_SET_SIGNAL_MASK vCPU %d: no signal %d", c.id, sig)
		}
		blocked &^= 1 << (sig - 1)
	}
	arg := signalMaskArg{Len: 8}
	binary.LittleEndian.PutUint64(arg.Sigset[:], blocked)
	if _, err := ioctlStruct(c.fd, ioctlSetSignalMask, &arg); err != nil {
		return fmt.Errorf("KVM_SET_SIGNAL_MASK vCPU %d: %w", c.id, err)
	}
	return nil
}

// RequestImmediateExit sets or clears kvm_run.immediate_exit: while set,
// KVM_RUN returns EINTR without entering the guest. Safe from any goroutine.
func (c *VCPU) RequestImmediateExit(on bool) {
	storeImmediateExit(c.run, on)
}

// GetRegs issues KVM_GET_REGS.
func (c *VCPU) GetRegs() (Regs, error) {
	var r Regs
	if _, err := ioctlStruct(c.fd, ioctlGetRegs, &r); err != nil {
		return r, fmt.Errorf("KVM_GET_REGS vCPU %d: %w", c.id, err)
	}
	return r, nil
}

// SetRegs issues KVM_SET_REGS.
func (c *VCPU) SetRegs(r Regs) error {
	if _, err := ioctlStruct(c.fd, ioctlSetRegs, &r); err != nil {
		return fmt.Errorf("KVM_SET_REGS vCPU %d: %w", c.id, err)
	}
	return nil
}

// GetSregs issues KVM_GET_SREGS.
func (c *VCPU) GetSregs() (Sregs, error) {
	var s Sregs
	if _, err := ioctlStruct(c.fd, ioctlGetSregs, &s); err != nil {
		return s, fmt.Errorf("KVM_GET_SREGS vCPU %d: %w", c.id, err)
	}
	return s, nil
}

// SetSregs issues KVM_SET_SREGS.
func (c *VCPU) SetSregs(s Sregs) error {
	if _, err := ioctlStruct(c.fd, ioctlSetSregs, &s); err != nil {
		return fmt.Errorf("KVM_SET_SREGS vCPU %d: %w", c.id, err)
	}
	return nil
}

// GetFPU issues KVM_GET_FPU.
func (c *VCPU) GetFPU() (FPU, error) {
	var f FPU
	if _, err := ioctlStruct(c.fd, ioctlGetFPU, &f); err != nil {
		return f, fmt.Errorf("KVM_GET_FPU vCPU %d: %w", c.id, err)
	}
	return f, nil
}

// SetFPU issues KVM_SET_FPU.
func (c *VCPU) SetFPU(f FPU) error {
	if _, err := ioctlStruct(c.fd, ioctlSetFPU, &f); err != nil {
		return fmt.Errorf("KVM_SET_FPU vCPU %d: %w", c.id, err)
	}
	return nil
}

// SetMSRs issues KVM_SET_MSRS. KVM reports how many it set; a short count is
// an error naming the first MSR it refused.
func (c *VCPU) SetMSRs(msrs []MSR) error {
	if len(msrs) > maxMSRs {
		return fmt.Errorf("KVM_SET_MSRS: %d MSRs, at most %d per call", len(msrs), maxMSRs)
	}
	arg := new(msrsArg)
	arg.Nmsrs = uint32(len(msrs))
	copy(arg.Entries[:], msrs)
	n, err := ioctlStruct(c.fd, ioctlSetMSRs, arg)
	if err != nil {
		return fmt.Errorf("KVM_SET_MSRS vCPU %d: %w", c.id, err)
	}
	if int(n) != len(msrs) {
		return fmt.Errorf("KVM_SET_MSRS vCPU %d: KVM refused MSR %#x (set %d of %d)",
			c.id, msrs[n].Index, n, len(msrs))
	}
	return nil
}

// GetMSRs issues KVM_GET_MSRS for the given indices.
func (c *VCPU) GetMSRs(indices []uint32) ([]MSR, error) {
	if len(indices) > maxMSRs {
		return nil, fmt.Errorf("KVM_GET_MSRS: %d MSRs, at most %d per call", len(indices), maxMSRs)
	}
	arg := new(msrsArg)
	arg.Nmsrs = uint32(len(indices))
	for i, idx := range indices {
		arg.Entries[i].Index = idx
	}
	n, err := ioctlStruct(c.fd, ioctlGetMSRs, arg)
	if err != nil {
		return nil, fmt.Errorf("KVM_GET_MSRS vCPU %d: %w", c.id, err)
	}
	if int(n) > len(indices) {
		n = uintptr(len(indices))
	}
	return append([]MSR(nil), arg.Entries[:n]...), nil
}

// SetCPUID2 issues KVM_SET_CPUID2: the CPUID table the guest sees.
func (c *VCPU) SetCPUID2(entries []CPUIDEntry) error {
	if len(entries) > maxCPUIDEntries {
		return fmt.Errorf("KVM_SET_CPUID2: %d entries, at most %d", len(entries), maxCPUIDEntries)
	}
	arg := new(cpuid2Arg)
	arg.Nent = uint32(len(entries))
	copy(arg.Entries[:], entries)
	if _, err := ioctlStruct(c.fd, ioctlSetCPUID2, arg); err != nil {
		return fmt.Errorf("KVM_SET_CPUID2 vCPU %d: %w", c.id, err)
	}
	return nil
}

// GetLAPIC issues KVM_GET_LAPIC.
func (c *VCPU) GetLAPIC() (LAPICState, error) {
	var s LAPICState
	if _, err := ioctlStruct(c.fd, ioctlGetLAPIC, &s); err != nil {
		return s, fmt.Errorf("KVM_GET_LAPIC vCPU %d: %w", c.id, err)
	}
	return s, nil
}

// SetLAPIC issues KVM_SET_LAPIC.
func (c *VCPU) SetLAPIC(s LAPICState) error {
	if _, err := ioctlStruct(c.fd, ioctlSetLAPIC, &s); err != nil {
		return fmt.Errorf("KVM_SET_LAPIC vCPU %d: %w", c.id, err)
	}
	return nil
}

// GetMPState issues KVM_GET_MP_STATE.
func (c *VCPU) GetMPState() (MPState, error) {
	var s mpStateArg
	if _, err := ioctlStruct(c.fd, ioctlGetMPState, &s); err != nil {
		return 0, fmt.Errorf("KVM_GET_MP_STATE vCPU %d: %w", c.id, err)
	}
	return MPState(s.State), nil
}

// SetMPState issues KVM_SET_MP_STATE (e.g. make an AP runnable without
// INIT/SIPI).
func (c *VCPU) SetMPState(st MPState) error {
	s := mpStateArg{State: uint32(st)}
	if _, err := ioctlStruct(c.fd, ioctlSetMPState, &s); err != nil {
		return fmt.Errorf("KVM_SET_MP_STATE vCPU %d: %w", c.id, err)
	}
	return nil
}

// kvm_run layout (offsets from <linux/kvm.h>, checked by the layout test).
const (
	runOffImmediateExit = 1
	runOffExitReason    = 8
	runOffUnion         = 32
	runMinSize          = 2352 // sizeof(struct kvm_run) up to the sync regs
	runUnionSize        = 256
)

// ExitReason returns kvm_run.exit_reason after Run.
func (c *VCPU) ExitReason() ExitReason {
	return ExitReason(binary.LittleEndian.Uint32(c.run[runOffExitReason:]))
}

func (c *VCPU) union() []byte { return c.run[runOffUnion : runOffUnion+runUnionSize] }

// IOExit describes a KVM_EXIT_IO: Size bytes (1, 2 or 4) per access, Count
// accesses (more than one for string I/O such as rep outsb), their data in
// Data (len Size*Count, inside kvm_run: for IN the VMM fills it).
type IOExit struct {
	Out   bool
	Size  int
	Port  uint16
	Count int
	Data  []byte
}

// IO decodes a KVM_EXIT_IO. The data offset and size come from the kernel
// but are still checked against the mapped area.
func (c *VCPU) IO() (IOExit, error) {
	u := c.union()
	e := IOExit{
		Out:   u[0] == IODirectionOut,
		Size:  int(u[1]),
		Port:  binary.LittleEndian.Uint16(u[2:]),
		Count: int(binary.LittleEndian.Uint32(u[4:])),
	}
	off := binary.LittleEndian.Uint64(u[8:])
	if e.Size != 1 && e.Size != 2 && e.Size != 4 {
		return e, fmt.Errorf("KVM_EXIT_IO with access size %d", e.Size)
	}
	total := uint64(e.Size) * uint64(e.Count)
	if e.Count <= 0 || off > uint64(len(c.run)) || total > uint64(len(c.run))-off {
		return e, fmt.Errorf("KVM_EXIT_IO data (offset %#x, %d×%d bytes) outside kvm_run (%d bytes)",
			off, e.Count, e.Size, len(c.run))
	}
	e.Data = c.run[off : off+total]
	return e, nil
}

// MMIOExit describes a KVM_EXIT_MMIO: Data (len 1..8, inside kvm_run) holds
// the written value, or receives the value to read.
type MMIOExit struct {
	Addr  uint64
	Write bool
	Data  []byte
}

// MMIO decodes a KVM_EXIT_MMIO.
func (c *VCPU) MMIO() (MMIOExit, error) {
	u := c.union()
	n := binary.LittleEndian.Uint32(u[16:])
	e := MMIOExit{Addr: binary.LittleEndian.Uint64(u[0:]), Write: u[20] != 0}
	if n == 0 || n > 8 {
		return e, fmt.Errorf("KVM_EXIT_MMIO at %#x with length %d", e.Addr, n)
	}
	e.Data = u[8 : 8+n]
	return e, nil
}

// InternalError describes a KVM_EXIT_INTERNAL_ERROR. For suberror 1
// (emulation failure) with the instruction-bytes flag, Instruction holds the
// bytes KVM failed to emulate.
type InternalError struct {
	Suberror    uint32
	Data        []uint64
	Instruction []byte
}

// Internal decodes a KVM_EXIT_INTERNAL_ERROR.
func (c *VCPU) Internal() InternalError {
	u := c.union()
	e := InternalError{Suberror: binary.LittleEndian.Uint32(u[0:])}
	n := binary.LittleEndian.Uint32(u[4:])
	if n > 16 {
		n = 16
	}
	for i := uint32(0); i < n; i++ {
		e.Data = append(e.Data, binary.LittleEndian.Uint64(u[8+8*i:]))
	}
	// struct emulation_failure overlays internal: flags at 8, insn_size at
	// 16, insn_bytes[15] at 17, valid when ndata covers them.
	if e.Suberror == InternalErrorEmulation && n >= 3 {
		flags := binary.LittleEndian.Uint64(u[8:])
		size := int(u[16])
		if flags&emulationFlagInstructionBytes != 0 && size > 0 && size <= 15 {
			e.Instruction = append([]byte(nil), u[17:17+size]...)
		}
	}
	return e
}

// FailEntry returns kvm_run.fail_entry: the hardware reason and the CPU.
func (c *VCPU) FailEntry() (reason uint64, cpu uint32) {
	u := c.union()
	return binary.LittleEndian.Uint64(u[0:]), binary.LittleEndian.Uint32(u[8:])
}

// SystemEvent returns kvm_run.system_event.type (SystemEvent…).
func (c *VCPU) SystemEvent() uint32 {
	return binary.LittleEndian.Uint32(c.union()[0:])
}
