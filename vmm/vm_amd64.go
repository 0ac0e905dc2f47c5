package vmm

import (
	"fmt"
	"os"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// setLINT wires the vCPU's LINT0 to ExtINT (the 8259) and LINT1 to NMI, as
// the MP table says and Linux expects (vmm/x86's SetLAPICLINTs).
func setLINT(c *kvm.VCPU) error {
	s, err := c.GetLAPIC()
	if err != nil {
		return err
	}
	if err := x86.SetLAPICLINTs(s.Regs[:]); err != nil {
		return err
	}
	if err := c.SetLAPIC(s); err != nil {
		return fmt.Errorf("setting LINT0/LINT1 of vCPU %d: %w", c.ID(), err)
	}
	return nil
}

// Addresses KVM needs in the MMIO hole on Intel (real mode support): three
// pages for the TSS and one for the EPT identity map, just below the BIOS
// area at the top of 4 GiB, as Firecracker and qemu place them.
const (
	TSSAddr         = x86.KVMTSSAddr
	IdentityMapAddr = x86.KVMIdentityMapAddr
)

// MaxVCPUs bounds Config.CPUs (APIC IDs and the IOAPIC ID share 8 bits).
const MaxVCPUs = x86.MaxCPUs

// createVM creates the KVM VM with its real-mode pages (TSS, EPT identity
// map), the in-kernel irqchip and the PIT.
func (v *VM) createVM() error {
	var err error
	if v.kvm, err = v.sys.CreateVM(); err != nil {
		return err
	}
	if err := v.kvm.SetTSSAddr(TSSAddr); err != nil {
		return err
	}
	if err := v.kvm.SetIdentityMapAddr(IdentityMapAddr); err != nil {
		return err
	}
	if err := v.kvm.CreateIRQChip(); err != nil {
		return err
	}
	return v.kvm.CreatePIT2()
}

// createVCPUs creates cpus vCPUs, each with policy's CPUID, the boot MSRs
// and its LAPIC's LINT pins wired (setLINT).
func (v *VM) createVCPUs(cpus int, policy CPUIDPolicy) error {
	supported, err := v.sys.GetSupportedCPUID()
	if err != nil {
		return err
	}
	tscDeadline, _ := v.sys.CheckExtension(kvm.CapTSCDeadlineTimer)
	msrs := bootMSRs()
	for i := 0; i < cpus; i++ {
		c, err := v.kvm.CreateVCPU(i)
		if err != nil {
			return err
		}
		t := &vcpuThread{index: i, vcpu: c}
		v.vcpus = append(v.vcpus, t)
		v.kvmStats = append(v.kvmStats, openStats(c))
		entries, err := policy(supported, CPUIDContext{CPU: i, CPUs: cpus, PVM: v.pvm, TSCDeadlineTimer: tscDeadline > 0})
		if err != nil {
			return fmt.Errorf("CPUID policy for vCPU %d: %w", i, err)
		}
		t.cpuid = entries
		if err := c.SetCPUID2(entries); err != nil {
			return err
		}
		if err := c.SetMSRs(msrs); err != nil {
			return err
		}
		if err := setLINT(c); err != nil {
			return err
		}
	}
	return nil
}

// hostTSCKnown reports whether the host kernel calibrated its CPU/TSC
// frequency; "cpu MHz : 0.000" in /proc/cpuinfo means it did not (seen
// under qemu's emulator, where PIT calibration fails), and KVM then cannot
// run a vCPU. Unknown (unreadable) counts as known.
func hostTSCKnown() bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return true
	}
	return cpuinfoTSCKnown(string(b))
}

func cpuinfoTSCKnown(cpuinfo string) bool {
	for _, line := range strings.Split(cpuinfo, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			return strings.TrimSpace(v) != "0.000"
		}
	}
	return true
}

// MaxGuestMemory bounds Config.MemoryBytes.
const MaxGuestMemory = x86.MaxGuestMemory

// mmioHole returns where RAM stops below 4 GiB: Config.MMIOHoleStart, or
// DefaultMMIOHoleStart.
func (cfg Config) mmioHole() (uint64, error) {
	hole := cfg.MMIOHoleStart
	if hole == 0 {
		hole = DefaultMMIOHoleStart
	}
	if hole%pageSize != 0 || hole > TSSAddr {
		return 0, fmt.Errorf("vmm: MMIO hole start %#x must be 4 KiB aligned and below %#x", hole, TSSAddr)
	}
	return hole, nil
}

// ramLayout is guest RAM split around the MMIO hole (Layout).
func ramLayout(size, hole uint64) []MemoryRegion { return Layout(size, hole) }

// checkHost warns about a host that does not know its TSC frequency.
func (v *VM) checkHost() {
	v.pvm, _ = kvm.IsPVM()
	if !hostTSCKnown() {
		v.log.Warn("the host kernel does not know its TSC frequency (cpu MHz 0 in /proc/cpuinfo): " +
			"KVM then never enters the guest (it keeps retrying the guest clock update) and the VM hangs; " +
			"if this host is itself a VM, boot it with tsc_early_khz=<TSC kHz>")
	}
}

// finishVM has nothing to add on x86: createVM made the irqchip before
// the vCPUs, as KVM_CREATE_IRQCHIP wants.
func (v *VM) finishVM() error { return nil }

// archVM is empty on x86: the irqchip and PIT belong to the VM fd.
type archVM struct{}

func (archVM) close() error { return nil }

// irqLineNumber is KVM_IRQ_LINE's irq for a GSI: the GSI itself on x86.
func irqLineNumber(gsi uint32) uint32 { return gsi }

// InterruptController names the VM's interrupt controller, for logs: KVM's
// in-kernel PIC and IOAPIC, with a local APIC per vCPU.
func (v *VM) InterruptController() string { return "IOAPIC" }
