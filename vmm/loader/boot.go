package loader

import (
	"errors"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// BootConfig is what PrepareBoot sets up.
type BootConfig struct {
	// MemBytes is the guest RAM size, laid out as x86.MemoryRegions.
	MemBytes uint64
	// CPUs is the vCPU count for the MP table, 1..x86.MaxCPUs.
	CPUs int
	// Kernel is the kernel image (vmlinux or bzImage).
	Kernel []byte
	// Initrd is the initrd, nil for none; InitrdSource, when set, is used
	// instead (streamed into guest memory).
	Initrd       []byte
	InitrdSource InitrdSource
	// Cmdline is the kernel command line.
	Cmdline string
	// PVH enters the vmlinux through its PVH entry (32-bit protected mode,
	// EBX = hvm_start_info) instead of the 64-bit Linux boot protocol. It
	// is an error if the image has no PVH note.
	PVH bool
}

// BootSetup is the result of PrepareBoot: what the VMM loads into the boot
// vCPU.
type BootSetup struct {
	Kernel                 Kernel
	InitrdAddr, InitrdSize uint64 // 0, 0 without an initrd
	// Regs and SRegs are the boot vCPU's (vCPU 0) registers. The other
	// vCPUs wait for INIT/SIPI from the boot vCPU in the in-kernel LAPIC,
	// which sets their registers; they need only CPUID, MSRs and LINTs.
	Regs  x86.Registers
	SRegs x86.SystemRegisters
}

// ErrBadBootConfig is returned for a BootConfig that cannot boot.
var ErrBadBootConfig = errors.New("bad boot configuration")

// PrepareBoot writes everything a Linux guest needs into guest memory
// (zeroed, MemBytes bytes laid out as x86.MemoryRegions): the kernel, the
// command line, the initrd, the MP table, and either the zero page, GDT
// and identity page tables (64-bit boot protocol) or the PVH start info
// and GDT (PVH). It returns the boot vCPU's registers.
func PrepareBoot(mem x86.GuestWriter, cfg BootConfig) (BootSetup, error) {
	if cfg.CPUs < 1 || cfg.CPUs > x86.MaxCPUs {
		return BootSetup{}, fmt.Errorf("%w: %d vCPUs, want 1..%d", ErrBadBootConfig, cfg.CPUs, x86.MaxCPUs)
	}
	e820, err := x86.E820Map(cfg.MemBytes)
	if err != nil {
		return BootSetup{}, err
	}
	k, err := LoadKernel(mem, cfg.MemBytes, cfg.Kernel)
	if err != nil {
		return BootSetup{}, err
	}
	if cfg.PVH && k.PVHEntry == 0 {
		return BootSetup{}, fmt.Errorf("%w: PVH boot asked for, but the %s has no XEN_ELFNOTE_PHYS32_ENTRY note (build with CONFIG_PVH=y)", ErrBadBootConfig, k.Format)
	}
	cmdlineLen, err := WriteCmdline(mem, cfg.Cmdline, k.CmdlineMaxSize)
	if err != nil {
		return BootSetup{}, err
	}
	setup := BootSetup{Kernel: k}
	initrd := cfg.InitrdSource
	if initrd == nil && len(cfg.Initrd) > 0 {
		initrd = InitrdBytes(cfg.Initrd)
	}
	if initrd != nil {
		addr, err := LoadInitrdFrom(mem, initrd, cfg.MemBytes, k.LoadEnd, k.InitrdAddrMax)
		if err != nil {
			return BootSetup{}, err
		}
		setup.InitrdAddr, setup.InitrdSize = addr, initrd.Size()
	}
	mp, err := x86.MPTable(cfg.CPUs)
	if err != nil {
		return BootSetup{}, err
	}
	if err := mem.WriteAt(mp, x86.MPTableAddr); err != nil {
		return BootSetup{}, fmt.Errorf("write MP table at %#x: %w", x86.MPTableAddr, err)
	}
	if err := x86.WriteBootGDT(mem); err != nil {
		return BootSetup{}, err
	}

	if cfg.PVH {
		err := x86.WritePVHStartInfo(mem, x86.PVHConfig{
			CmdlineAddr: x86.CmdlineAddr,
			InitrdAddr:  setup.InitrdAddr, InitrdSize: setup.InitrdSize,
			E820: e820,
		})
		if err != nil {
			return BootSetup{}, err
		}
		setup.Regs = x86.PVHBootRegisters(k.PVHEntry)
		setup.SRegs = x86.PVHSystemRegisters()
		return setup, nil
	}

	zeroPage, err := x86.BuildBootParams(x86.BootParamsConfig{
		SetupHeader: k.SetupHeader,
		CmdlineAddr: x86.CmdlineAddr,
		CmdlineSize: uint32(cmdlineLen),
		InitrdAddr:  setup.InitrdAddr, InitrdSize: setup.InitrdSize,
		E820: e820,
	})
	if err != nil {
		return BootSetup{}, err
	}
	if err := mem.WriteAt(zeroPage, x86.ZeroPageAddr); err != nil {
		return BootSetup{}, fmt.Errorf("write zero page at %#x: %w", x86.ZeroPageAddr, err)
	}
	cr3, err := x86.WriteIdentityPageTables(mem)
	if err != nil {
		return BootSetup{}, err
	}
	setup.Regs = x86.LinuxBootRegisters(k.Entry64)
	setup.SRegs = x86.LongModeSystemRegisters(cr3)
	return setup, nil
}
