package arm64

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/loader"
)

// Where PrepareBoot puts things in RAM, after booting.rst:
//
//	RAMBase                 2 MiB-aligned kernel base; the kernel at
//	                        RAMBase + text_offset, image_size bytes
//	...                     free RAM
//	initrd                  64 KiB-aligned, ending at or below the DTB slot
//	DTB slot                the last whole 2 MiB block below the boot top:
//	                        the DTB at its start
//	boot top                min(RAM end, RAMBase + BootWindowSize)
//
// The DTB gets a 2 MiB block to itself because the kernel maps it with
// blocks of up to 2 MiB; the initrd sits as high as it can so the kernel's
// early allocations above its image stay free, and both stay within the
// 32 GiB window from RAMBase (1 GiB-aligned, covering the kernel) in which
// booting.rst wants the initrd. (Kernels before v4.2 also wanted the DTB
// within 512 MiB of the kernel; we do not boot those.)
const (
	// DTBMaxSize is the most a DTB may be (booting.rst), and the size of
	// the block it is placed in.
	DTBMaxSize uint64 = 2 << 20
	// BootWindowSize is the window from RAMBase holding the kernel, the
	// initrd and the DTB.
	BootWindowSize uint64 = 32 << 30
	// InitrdAlign is the initrd's alignment: a page for every arm64 page
	// size.
	InitrdAlign uint64 = 0x1_0000
)

// PSTATE bits of the boot vCPU: EL1 with its own stack pointer (EL1h) and
// the debug, SError, IRQ and FIQ exceptions masked, as booting.rst wants.
const (
	pstateModeEL1h uint64 = 0x5
	pstateF        uint64 = 1 << 6
	pstateI        uint64 = 1 << 7
	pstateA        uint64 = 1 << 8
	pstateD        uint64 = 1 << 9
	// BootPSTATE is the boot vCPU's PSTATE (0x3c5).
	BootPSTATE = pstateModeEL1h | pstateF | pstateI | pstateA | pstateD
)

// GuestWriter writes guest physical memory. It must return an error (never
// panic) when [gpa, gpa+len(p)) is not wholly inside guest RAM. It has the
// shape of x86.GuestWriter, so the VMM's guest memory and loader's
// InitrdSource work with both.
type GuestWriter interface {
	WriteAt(p []byte, gpa uint64) error
}

// BootConfig is what PrepareBoot sets up.
type BootConfig struct {
	// MemBytes is the guest RAM size, laid out as MemoryRegions.
	MemBytes uint64
	// CPUs is the vCPU count, 1..MaxCPUs (MaxCPUsGICv2 with a GICv2).
	CPUs int
	// GIC is the VM's interrupt controller (the zero value GICv3).
	GIC GIC
	// Kernel is the arm64 Linux Image (uncompressed).
	Kernel []byte
	// Initrd is the initrd, nil for none; InitrdSource, when set, is used
	// instead (streamed into guest memory).
	Initrd       []byte
	InitrdSource loader.InitrdSource
	// Cmdline is the kernel command line.
	Cmdline string
	// Virtio are the virtio-mmio devices to announce in the device tree.
	Virtio []MMIODevice
}

// BootSetup is the result of PrepareBoot: where everything went, and what
// the VMM loads into the boot vCPU (see Registers).
type BootSetup struct {
	Image ImageHeader
	// KernelAddr and KernelEnd bound the kernel's image_size bytes.
	KernelAddr, KernelEnd uint64
	// KernelEntry is the boot vCPU's PC: the Image's first byte.
	KernelEntry uint64
	// DTBAddr is the device tree's address, the boot vCPU's X0.
	DTBAddr, DTBSize uint64
	// InitrdAddr and InitrdSize are 0, 0 without an initrd.
	InitrdAddr, InitrdSize uint64
}

// BootRegisters are the boot vCPU's (vCPU 0) registers. X1..X3 and the
// rest stay 0 as KVM resets them; the other vCPUs start powered off and
// are brought up by the guest through PSCI CPU_ON.
type BootRegisters struct {
	PC     uint64
	X0     uint64
	PSTATE uint64
}

// Registers returns the boot vCPU's registers for this setup.
func (s BootSetup) Registers() BootRegisters {
	return BootRegisters{PC: s.KernelEntry, X0: s.DTBAddr, PSTATE: BootPSTATE}
}

// PrepareBoot writes everything an arm64 Linux guest needs into guest
// memory (zeroed, MemBytes bytes at RAMBase): the kernel, the initrd and
// the device tree, placed as the comment above says. It checks the whole
// configuration before writing anything.
func PrepareBoot(mem GuestWriter, cfg BootConfig) (BootSetup, error) {
	dtCfg := DeviceTreeConfig{CPUs: cfg.CPUs, GIC: cfg.GIC, MemBytes: cfg.MemBytes, Cmdline: cfg.Cmdline, Virtio: cfg.Virtio}
	if err := dtCfg.check(); err != nil {
		return BootSetup{}, err
	}
	h, err := ParseImageHeader(cfg.Kernel)
	if err != nil {
		return BootSetup{}, err
	}
	s := BootSetup{Image: h, KernelAddr: RAMBase + h.TextOffset}
	s.KernelEnd = s.KernelAddr + h.ImageSize
	s.KernelEntry = s.KernelAddr
	s.DTBAddr = dtbSlot(cfg.MemBytes)
	if s.KernelEnd > s.DTBAddr {
		return BootSetup{}, fmt.Errorf("%w: the kernel [%#x, %#x) does not fit below the device tree at %#x; give the guest more memory", loader.ErrNoRoom, s.KernelAddr, s.KernelEnd, s.DTBAddr)
	}
	initrd := cfg.InitrdSource
	if initrd == nil && len(cfg.Initrd) > 0 {
		initrd = loader.InitrdBytes(cfg.Initrd)
	}
	if initrd != nil {
		s.InitrdSize = initrd.Size()
		if s.InitrdAddr, err = placeInitrd(s.InitrdSize, s.KernelEnd, s.DTBAddr); err != nil {
			return BootSetup{}, err
		}
		dtCfg.InitrdStart, dtCfg.InitrdEnd = s.InitrdAddr, s.InitrdAddr+s.InitrdSize
	}
	dtb, err := DeviceTree(dtCfg)
	if err != nil {
		return BootSetup{}, err
	}
	s.DTBSize = uint64(len(dtb))
	if err := mem.WriteAt(cfg.Kernel, s.KernelAddr); err != nil {
		return BootSetup{}, fmt.Errorf("write kernel at %#x: %w", s.KernelAddr, err)
	}
	if initrd != nil {
		if err := initrd.WriteTo(mem, s.InitrdAddr); err != nil {
			return BootSetup{}, fmt.Errorf("write initrd at %#x: %w", s.InitrdAddr, err)
		}
	}
	if err := mem.WriteAt(dtb, s.DTBAddr); err != nil {
		return BootSetup{}, fmt.Errorf("write device tree at %#x: %w", s.DTBAddr, err)
	}
	return s, nil
}

// dtbSlot returns the start of the last whole 2 MiB block below the boot
// top, for memBytes of RAM (checked: at least MinRAM, so the block is in
// RAM).
func dtbSlot(memBytes uint64) uint64 {
	top := RAMBase + min(memBytes, BootWindowSize)
	return (top - DTBMaxSize) &^ (DTBMaxSize - 1)
}

// placeInitrd returns the highest InitrdAlign-aligned address at which size
// bytes end at or below limit and start at or above floor.
func placeInitrd(size, floor, limit uint64) (uint64, error) {
	floor = (floor + InitrdAlign - 1) &^ (InitrdAlign - 1)
	if size == 0 {
		return 0, fmt.Errorf("%w: the initrd is empty", loader.ErrNoRoom)
	}
	if size > limit || (limit-size)&^(InitrdAlign-1) < floor {
		return 0, fmt.Errorf("%w: initrd of %d bytes does not fit between the kernel's end %#x and the device tree at %#x; give the guest more memory or use a smaller initrd", loader.ErrNoRoom, size, floor, limit)
	}
	return (limit - size) &^ (InitrdAlign - 1), nil
}
