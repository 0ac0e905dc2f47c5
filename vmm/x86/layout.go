package x86

// The guest physical address layout, after Firecracker's
// arch/x86_64/layout.rs. Everything below 1 MiB is small boot data written
// by the VMM before the first KVM_RUN; the kernel goes at or above 1 MiB;
// devices live in the 32-bit MMIO hole below 4 GiB.
//
//	0x0000_0500  boot GDT (BootGDTAddr), then the empty IDT (BootIDTAddr)
//	0x0000_6000  PVH hvm_start_info, module list, memory map
//	0x0000_7000  Linux zero page (struct boot_params)
//	0x0000_8ff0  initial stack pointer (grows down, below 0x9000)
//	0x0000_9000  PML4, then PDPT at 0xa000, 4 PDs at 0xb000..0xefff
//	0x0002_0000  kernel command line (CmdlineMaxSize bytes)
//	0x0009_fc00  EBDA: MP floating pointer + MP config table (reserved in e820)
//	0x0010_0000  high memory: bzImage protected-mode kernel for old protocols
//	0x0100_0000  64-bit kernel (vmlinux p_paddr, bzImage pref_address)
//	...          initrd, page-aligned at the top of low RAM
//	0xC000_0000  32-bit MMIO hole (no RAM) up to 4 GiB
//	0xD000_0000  virtio-mmio devices, 4 KiB each
//	0xFEC0_0000  IOAPIC
//	0xFEE0_0000  LAPIC
//	0xFFFB_C000  KVM identity-map page, then the 3-page KVM TSS
//	0x1_0000_0000 RAM beyond the hole (when the guest has more than 3 GiB)
const (
	// BootGDTAddr is where WriteBootGDT puts the boot GDT (BootGDT, up to
	// 12 entries before BootIDTAddr). Real-mode BIOS data would live here on
	// a PC; we have no BIOS.
	BootGDTAddr uint64 = 0x500
	// BootIDTAddr is where WriteBootGDT puts an empty 8-byte IDT: the
	// kernel installs its own before enabling interrupts.
	BootIDTAddr uint64 = 0x560

	// PVHStartInfoAddr holds struct hvm_start_info for the PVH entry.
	PVHStartInfoAddr uint64 = 0x6000
	// PVHModlistAddr holds the hvm_modlist_entry array (the initrd).
	PVHModlistAddr uint64 = 0x6040
	// PVHMemmapAddr holds the hvm_memmap_table_entry array; it runs up to
	// ZeroPageAddr, room for PVHMaxMemmapEntries entries.
	PVHMemmapAddr uint64 = 0x6100

	// ZeroPageAddr holds the 4 KiB struct boot_params passed in RSI to the
	// 64-bit Linux entry point.
	ZeroPageAddr uint64 = 0x7000
	// ZeroPageSize is the size of struct boot_params.
	ZeroPageSize = 0x1000

	// BootStackPointer is the initial RSP/RBP: the top of the page below the
	// page tables, 16-byte aligned. Linux's startup_64 sets its own stack
	// almost at once; this one only has to be valid memory.
	BootStackPointer uint64 = 0x8ff0

	// PML4Addr is the identity-map PML4 and the value of CR3.
	PML4Addr uint64 = 0x9000
	// PDPTAddr is the single page-directory-pointer table.
	PDPTAddr uint64 = 0xa000
	// PDAddr is the first of IdentityMapPDs page directories (one per GiB).
	PDAddr uint64 = 0xb000
	// IdentityMapPDs is the number of page directories: 4 map 4 GiB.
	IdentityMapPDs = 4
	// IdentityMapSize is how much of the address space the boot page
	// tables identity-map (see WriteIdentityPageTables for why 4 GiB).
	IdentityMapSize uint64 = IdentityMapPDs << 30

	// CmdlineAddr is where the kernel command line is written.
	CmdlineAddr uint64 = 0x20000
	// CmdlineMaxSize bounds the command line including its NUL: Linux x86's
	// COMMAND_LINE_SIZE. A bzImage announces its own limit in cmdline_size.
	CmdlineMaxSize = 2048

	// EBDAStart is the start of the Extended BIOS Data Area; e820 marks
	// EBDAStart..HighMemStart reserved so the kernel never allocates it.
	EBDAStart uint64 = 0x9fc00
	// MPTableAddr is where the MP floating pointer and configuration table
	// go. Linux scans the last KiB of base memory (0x9fc00) for the
	// floating pointer; the configuration table follows it and may run into
	// the reserved 0xa0000..0xfffff range, which is still RAM to KVM.
	MPTableAddr uint64 = EBDAStart
	// MPTableMaxSize is the room MPTable output may use.
	MPTableMaxSize = HighMemStart - MPTableAddr

	// HighMemStart is the first byte above the legacy 1 MiB.
	HighMemStart uint64 = 0x100000
	// KernelLoadAddr is the usual load address of a 64-bit kernel (Linux's
	// CONFIG_PHYSICAL_START, vmlinux's first p_paddr, bzImage's
	// pref_address). Informational: loaders use the image's own values.
	KernelLoadAddr uint64 = 0x1000000

	// MMIOHoleStart is the first byte of the 32-bit MMIO hole: RAM stops
	// here and resumes at MMIOHoleEnd.
	MMIOHoleStart uint64 = 0xC000_0000
	// MMIOHoleEnd is 4 GiB, where RAM above the hole starts.
	MMIOHoleEnd uint64 = 1 << 32

	// VirtioMMIOBase is the first virtio-mmio device window; device i is at
	// VirtioMMIOBase + i*VirtioMMIOSize.
	VirtioMMIOBase uint64 = 0xD000_0000
	// VirtioMMIOSize is the window of one virtio-mmio device.
	VirtioMMIOSize uint64 = 0x1000
	// VirtioMMIOMaxDevices bounds the devices so windows stay below the
	// IOAPIC.
	VirtioMMIOMaxDevices = 1024

	// IOAPICAddr is the in-kernel IOAPIC's MMIO base.
	IOAPICAddr uint64 = 0xFEC0_0000
	// IOAPICPins is the number of pins of KVM's IOAPIC (GSI 0..23).
	IOAPICPins = 24
	// LAPICAddr is the local APIC's MMIO base.
	LAPICAddr uint64 = 0xFEE0_0000

	// KVMIdentityMapAddr is for KVM_SET_IDENTITY_MAP_ADDR (one page, used
	// by KVM on Intel for real-mode emulation); placed below the TSS as
	// qemu and Firecracker do.
	KVMIdentityMapAddr uint64 = 0xFFFB_C000
	// KVMTSSAddr is for KVM_SET_TSS_ADDR (three pages, Intel only). Both
	// live in the MMIO hole, where no RAM or device is.
	KVMTSSAddr uint64 = 0xFFFB_D000

	// InitrdAlign is the alignment of the initrd: a page, as Linux wants.
	InitrdAlign uint64 = 0x1000
	// DefaultInitrdAddrMax is the highest byte address an initrd may use
	// when the kernel does not say (a vmlinux has no setup header): the
	// x86-64 setup header's initrd_addr_max.
	DefaultInitrdAddrMax uint64 = 0x7fff_ffff

	// MaxGuestMemory bounds the guest RAM size the builders accept (1 TiB):
	// far beyond this VMM's needs, and within 4-level paging.
	MaxGuestMemory uint64 = 1 << 40
)
