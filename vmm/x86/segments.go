package x86

import (
	"encoding/binary"
	"fmt"
)

// Selectors of the boot GDT. The 64-bit Linux boot protocol
// (Documentation/arch/x86/boot.rst, "64-bit Boot Protocol") requires a GDT
// with 4 GiB flat segments at __BOOT_CS = 0x10 (execute/read) and
// __BOOT_DS = 0x18 (read/write), CS = __BOOT_CS and DS = ES = SS = __BOOT_DS,
// so the code and data selectors follow the kernel's numbering rather than
// Firecracker's 0x08/0x10. The PVH entry (32-bit protected mode) uses the
// 32-bit code segment at 0x08 and the same data segment.
const (
	SelectorNull   uint16 = 0x00
	SelectorCode32 uint16 = 0x08
	SelectorCode64 uint16 = 0x10
	SelectorData   uint16 = 0x18
	SelectorTSS    uint16 = 0x20
)

// Control-register and EFER bits used at boot.
const (
	CR0ProtectionEnable uint64 = 1 << 0  // PE
	CR0ExtensionType    uint64 = 1 << 4  // ET, hard-wired to 1 on modern CPUs
	CR0Paging           uint64 = 1 << 31 // PG
	CR4PAE              uint64 = 1 << 5  // physical address extension
	EFERLongModeEnable  uint64 = 1 << 8  // LME
	EFERLongModeActive  uint64 = 1 << 10 // LMA
	RFLAGSReserved1     uint64 = 1 << 1  // bit 1 of RFLAGS always reads 1
)

// Long mode: protected mode with paging (CR3 = PML4Addr), PAE, and
// EFER.LME/LMA. Interrupts stay off (RFLAGS.IF clear) as both protocols ask.
const (
	LongModeCR0  = CR0ProtectionEnable | CR0ExtensionType | CR0Paging
	LongModeCR4  = CR4PAE
	LongModeEFER = EFERLongModeEnable | EFERLongModeActive
	// PVHCR0 is 32-bit protected mode without paging, as the PVH entry
	// requires.
	PVHCR0 = CR0ProtectionEnable | CR0ExtensionType
)

// GDTEntry encodes a segment descriptor. flags holds the access byte in
// bits 0..7 (P, DPL, S, type) and G, D/B, L, AVL in bits 12..15, as in
// Linux's GDT_ENTRY macro.
func GDTEntry(flags uint16, base, limit uint32) uint64 {
	return uint64(base&0xff000000)<<(56-24) |
		uint64(flags&0xf0ff)<<40 |
		uint64(limit&0x000f0000)<<(48-16) |
		uint64(base&0x00ffffff)<<16 |
		uint64(limit&0x0000ffff)
}

// BootGDT returns the boot GDT, indexed by selector/8:
//
//	0x00 null
//	0x08 32-bit flat code (0xc09b), for the PVH entry
//	0x10 64-bit code (0xa09b: L=1, G=1)
//	0x18 flat data (0xc093: D/B=1, G=1), for both modes
//	0x20 busy TSS, base 0 limit 0x67; a 64-bit TSS descriptor is 16 bytes,
//	     so entry 0x28 holds its upper base (0). KVM requires a usable TR.
func BootGDT() []uint64 {
	return []uint64{
		0,
		GDTEntry(0xc09b, 0, 0xfffff),
		GDTEntry(0xa09b, 0, 0xfffff),
		GDTEntry(0xc093, 0, 0xfffff),
		GDTEntry(0x008b, 0, 0x67),
		0,
	}
}

// Segment is a segment register as KVM's struct kvm_segment holds it: the
// descriptor cache, with Limit in bytes (already scaled by G).
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
}

// SegmentFromGDT decodes the descriptor at GDT index (selector = index*8).
func SegmentFromGDT(entry uint64, index int) Segment {
	limit := uint32(entry&0xffff) | uint32((entry>>48)&0xf)<<16
	g := uint8((entry >> 55) & 1)
	if g == 1 {
		limit = limit<<12 | 0xfff
	}
	return Segment{
		Base:     (entry>>16)&0xffffff | ((entry>>56)&0xff)<<24,
		Limit:    limit,
		Selector: uint16(index * 8),
		Type:     uint8((entry >> 40) & 0xf),
		S:        uint8((entry >> 44) & 1),
		DPL:      uint8((entry >> 45) & 3),
		Present:  uint8((entry >> 47) & 1),
		AVL:      uint8((entry >> 52) & 1),
		L:        uint8((entry >> 53) & 1),
		DB:       uint8((entry >> 54) & 1),
		G:        g,
	}
}

// DescriptorTable is a GDTR or IDTR value.
type DescriptorTable struct {
	Base  uint64
	Limit uint16
}

// SystemRegisters is the subset of KVM's struct kvm_sregs the boot sets.
// The VMM reads the vCPU's sregs, overwrites these fields, and writes them
// back (leaving APIC base, CR2, CR8 and the interrupt bitmap as KVM has
// them).
type SystemRegisters struct {
	CS, DS, ES, FS, GS, SS Segment
	TR, LDT                Segment
	GDT, IDT               DescriptorTable
	CR0, CR3, CR4, EFER    uint64
}

// Registers mirrors KVM's struct kvm_regs, field for field.
type Registers struct {
	RAX, RBX, RCX, RDX uint64
	RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11   uint64
	R12, R13, R14, R15 uint64
	RIP, RFLAGS        uint64
}

// WriteBootGDT writes BootGDT at BootGDTAddr and an empty IDT at
// BootIDTAddr.
func WriteBootGDT(mem GuestWriter) error {
	gdt := BootGDT()
	buf := make([]byte, 8*len(gdt))
	for i, e := range gdt {
		binary.LittleEndian.PutUint64(buf[i*8:], e)
	}
	if err := mem.WriteAt(buf, BootGDTAddr); err != nil {
		return fmt.Errorf("write boot GDT at %#x: %w", BootGDTAddr, err)
	}
	if err := mem.WriteAt(make([]byte, 8), BootIDTAddr); err != nil {
		return fmt.Errorf("write boot IDT at %#x: %w", BootIDTAddr, err)
	}
	return nil
}

func bootTables() (gdt, idt DescriptorTable) {
	return DescriptorTable{Base: BootGDTAddr, Limit: uint16(8*len(BootGDT()) - 1)},
		DescriptorTable{Base: BootIDTAddr, Limit: 7}
}

// ldtReset is the LDTR as after reset: null selector, present, type LDT.
var ldtReset = Segment{Limit: 0xffff, Type: 2, Present: 1}

// LongModeSystemRegisters returns the system registers for the 64-bit Linux
// entry: flat 64-bit code at SelectorCode64, flat data in every data segment
// register, the boot GDT and empty IDT, paging on with CR3 = cr3 (from
// WriteIdentityPageTables), PAE and EFER.LME|LMA. WriteBootGDT and
// WriteIdentityPageTables must have written guest memory.
func LongModeSystemRegisters(cr3 uint64) SystemRegisters {
	gdtEntries := BootGDT()
	code := SegmentFromGDT(gdtEntries[SelectorCode64/8], int(SelectorCode64/8))
	data := SegmentFromGDT(gdtEntries[SelectorData/8], int(SelectorData/8))
	tss := SegmentFromGDT(gdtEntries[SelectorTSS/8], int(SelectorTSS/8))
	gdt, idt := bootTables()
	return SystemRegisters{
		CS: code, DS: data, ES: data, FS: data, GS: data, SS: data,
		TR: tss, LDT: ldtReset,
		GDT: gdt, IDT: idt,
		CR0: LongModeCR0, CR3: cr3, CR4: LongModeCR4, EFER: LongModeEFER,
	}
}

// PVHSystemRegisters returns the system registers for the PVH entry
// (xen/include/public/arch-x86/hvm/start_info.h): 32-bit protected mode,
// paging off, CS a flat 32-bit code segment, DS/ES/SS flat data, TR a
// 32-bit TSS with limit 0x67.
func PVHSystemRegisters() SystemRegisters {
	gdtEntries := BootGDT()
	code := SegmentFromGDT(gdtEntries[SelectorCode32/8], int(SelectorCode32/8))
	data := SegmentFromGDT(gdtEntries[SelectorData/8], int(SelectorData/8))
	tss := SegmentFromGDT(gdtEntries[SelectorTSS/8], int(SelectorTSS/8))
	gdt, idt := bootTables()
	return SystemRegisters{
		CS: code, DS: data, ES: data, FS: data, GS: data, SS: data,
		TR: tss, LDT: ldtReset,
		GDT: gdt, IDT: idt,
		CR0: PVHCR0,
	}
}

// LinuxBootRegisters returns the boot vCPU's registers for the 64-bit Linux
// entry at entry: RSI = ZeroPageAddr (struct boot_params), a valid stack,
// interrupts off.
func LinuxBootRegisters(entry uint64) Registers {
	return Registers{
		RIP: entry, RSP: BootStackPointer, RBP: BootStackPointer,
		RSI: ZeroPageAddr, RFLAGS: RFLAGSReserved1,
	}
}

// PVHBootRegisters returns the boot vCPU's registers for the PVH entry at
// entry: EBX = PVHStartInfoAddr (struct hvm_start_info), interrupts off.
func PVHBootRegisters(entry uint64) Registers {
	return Registers{
		RIP: entry, RBX: PVHStartInfoAddr, RSP: BootStackPointer,
		RFLAGS: RFLAGSReserved1,
	}
}
