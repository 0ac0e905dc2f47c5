package kvm

// Regs mirrors struct kvm_regs (144 bytes): the general-purpose registers.
type Regs struct {
	RAX, RBX, RCX, RDX uint64
	RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11   uint64
	R12, R13, R14, R15 uint64
	RIP, RFLAGS        uint64
}

// Segment mirrors struct kvm_segment (24 bytes).
type Segment struct {
	Base     uint64
	Limit    uint32
	Selector uint16
	Type     uint8
	Present  uint8
	DPL      uint8
	DB       uint8
	S        uint8
	L        uint8
	G        uint8
	AVL      uint8
	Unusable uint8
	_        uint8
}

// DTable mirrors struct kvm_dtable (16 bytes): a GDT or IDT register.
type DTable struct {
	Base  uint64
	Limit uint16
	_     [3]uint16
}

// Sregs mirrors struct kvm_sregs (312 bytes): segment and control registers.
type Sregs struct {
	CS, DS, ES, FS, GS, SS Segment
	TR, LDT                Segment
	GDT, IDT               DTable
	CR0, CR2, CR3, CR4     uint64
	CR8                    uint64
	EFER                   uint64
	APICBase               uint64
	InterruptBitmap        [4]uint64
}

// FPU mirrors struct kvm_fpu (416 bytes).
type FPU struct {
	FPR        [8][16]uint8
	FCW        uint16
	FSW        uint16
	FTWX       uint8
	_          uint8
	LastOpcode uint16
	LastIP     uint64
	LastDP     uint64
	XMM        [16][16]uint8
	MXCSR      uint32
	_          uint32
}

// MSR is one struct kvm_msr_entry (16 bytes).
type MSR struct {
	Index uint32
	_     uint32
	Data  uint64
}

// CPUIDEntry mirrors struct kvm_cpuid_entry2 (40 bytes).
type CPUIDEntry struct {
	Function uint32
	Index    uint32
	Flags    uint32
	EAX      uint32
	EBX      uint32
	ECX      uint32
	EDX      uint32
	_        [3]uint32
}

// CPUIDFlagSignificantIndex marks a CPUID entry whose Index (ECX input) matters.
const CPUIDFlagSignificantIndex = 1

// UserspaceMemoryRegion mirrors struct kvm_userspace_memory_region (32 bytes).
type UserspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
}

// irqfdArg mirrors struct kvm_irqfd (32 bytes).
type irqfdArg struct {
	FD         uint32
	GSI        uint32
	Flags      uint32
	ResampleFD uint32
	_          [16]uint8
}

// ioeventfdArg mirrors struct kvm_ioeventfd (64 bytes).
type ioeventfdArg struct {
	Datamatch uint64
	Addr      uint64
	Len       uint32
	FD        int32
	Flags     uint32
	_         [36]uint8
}

// irqLevelArg mirrors struct kvm_irq_level (8 bytes).
type irqLevelArg struct {
	IRQ   uint32
	Level uint32
}

// pitConfigArg mirrors struct kvm_pit_config (64 bytes).
type pitConfigArg struct {
	Flags uint32
	_     [15]uint32
}

// LAPICState mirrors struct kvm_lapic_state: the 1 KiB local APIC register
// page, each 32-bit register at its architectural offset.
type LAPICState struct {
	Regs [1024]byte
}

// Register returns the 32-bit LAPIC register at offset (e.g. 0x350 LVT LINT0).
// Offsets outside the page read as 0.
func (s *LAPICState) Register(offset int) uint32 {
	if offset < 0 || offset+4 > len(s.Regs) {
		return 0
	}
	b := s.Regs[offset : offset+4]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// SetRegister sets the 32-bit LAPIC register at offset; out of range is ignored.
func (s *LAPICState) SetRegister(offset int, v uint32) {
	if offset < 0 || offset+4 > len(s.Regs) {
		return
	}
	b := s.Regs[offset : offset+4]
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// mpStateArg mirrors struct kvm_mp_state.
type mpStateArg struct {
	State uint32
}
