package vmm

import (
	"errors"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// MaxVCPUs bounds Config.CPUs: the redistributor region vmm/arm64 lays out
// below the distributor holds that many.
const MaxVCPUs = arm64.MaxCPUs

// MaxGuestMemory bounds Config.MemoryBytes.
const MaxGuestMemory = arm64.MaxRAM

// archVM is what an arm64 VM adds: the in-kernel GIC, a device of its
// own (KVM_CREATE_DEVICE) rather than a part of the VM fd, and which kind
// it is.
type archVM struct {
	gic     *kvm.Device
	gicKind arm64.GIC
}

// GIC is the kind of interrupt controller the VM has, which the device
// tree must announce.
func (v *VM) GIC() arm64.GIC { return v.arch.gicKind }

// InterruptController names the VM's interrupt controller, for logs.
func (v *VM) InterruptController() string { return v.arch.gicKind.String() }

func (a *archVM) close() error {
	if a.gic == nil {
		return nil
	}
	err := a.gic.Close()
	a.gic = nil
	return err
}

// mmioHole: arm64 RAM is one region from arm64.RAMBase, with every device
// below it, so there is no hole to place.
func (cfg Config) mmioHole() (uint64, error) {
	if cfg.MMIOHoleStart != 0 {
		return 0, errors.New("vmm: MMIOHoleStart is an x86 setting; arm64 RAM starts above the devices")
	}
	return 0, nil
}

// ramLayout is arm64's single RAM region.
func ramLayout(size, _ uint64) []MemoryRegion {
	return []MemoryRegion{{GPA: arm64.RAMBase, Size: size}}
}

// checkHost has nothing to look at on arm64: the arch timer's rate comes
// from the hardware (CNTFRQ_EL0), and there is no PVM.
func (v *VM) checkHost() {}

// createVM creates the KVM VM. Its GIC comes after the vCPUs (finishVM).
func (v *VM) createVM() error {
	var err error
	v.kvm, err = v.sys.CreateVM()
	return err
}

// createVCPUs creates cpus vCPUs of KVM's preferred target with PSCI 0.2,
// which KVM then serves itself (CPU_ON, CPU_OFF, SYSTEM_OFF and
// SYSTEM_RESET, the last two as system-event exits). Every vCPU but the
// first starts powered off, waiting for the guest's CPU_ON. The CPUID
// policy is x86's and has no use here.
func (v *VM) createVCPUs(cpus int, _ CPUIDPolicy) error {
	target, err := v.kvm.ARMPreferredTarget()
	if err != nil {
		return err
	}
	target.SetFeature(kvm.ARMVCPUPSCI02)
	for i := 0; i < cpus; i++ {
		c, err := v.kvm.CreateVCPU(i)
		if err != nil {
			return err
		}
		v.vcpus = append(v.vcpus, &vcpuThread{index: i, vcpu: c})
		v.kvmStats = append(v.kvmStats, openStats(c))
		init := target
		if i > 0 {
			init.SetFeature(kvm.ARMVCPUPowerOff)
		}
		if err := c.ARMInit(init); err != nil {
			return fmt.Errorf("vCPU %d: %w", i, err)
		}
	}
	return nil
}

// finishVM creates the in-kernel GIC, a GICv3 where KVM can emulate one,
// else a GICv2 (a host whose own GIC is a GICv2), and initialises it:
// KVM wants every vCPU created before that.
func (v *VM) finishVM() error {
	switch {
	case v.kvm.CanCreateDevice(kvm.DeviceARMVGICv3) == nil:
		return v.createGIC(arm64.GICv3, kvm.DeviceARMVGICv3, []gicFrame{
			{"distributor", kvm.VGICV3AddrDist, arm64.GICDistributorBase},
			{"redistributors", kvm.VGICV3AddrRedist, arm64.GICRedistributorBase},
		})
	case v.kvm.CanCreateDevice(kvm.DeviceARMVGICv2) == nil:
		if len(v.vcpus) > arm64.MaxCPUsGICv2 {
			return fmt.Errorf("vmm: this host's KVM gives guests a GICv2 only, which serves at most %d vCPUs, not %d",
				arm64.MaxCPUsGICv2, len(v.vcpus))
		}
		return v.createGIC(arm64.GICv2, kvm.DeviceARMVGICv2, []gicFrame{
			{"distributor", kvm.VGICV2AddrDist, arm64.GICDistributorBase},
			{"CPU interface", kvm.VGICV2AddrCPU, arm64.GICv2CPUInterfaceBase},
		})
	default:
		return errors.New("vmm: this host's KVM can emulate neither a GICv3 nor a GICv2")
	}
}

// gicFrame is one of a GIC's MMIO frames: its KVM address attribute and
// where vmm/arm64 puts it.
type gicFrame struct {
	name string
	attr uint64
	addr uint64
}

// createGIC creates the in-kernel GIC of kind (KVM device typ) with its
// frames at their addresses and arm64.GICIRQs interrupts, and initialises it.
func (v *VM) createGIC(kind arm64.GIC, typ uint32, frames []gicFrame) error {
	gic, err := v.kvm.CreateDevice(typ)
	if err != nil {
		return fmt.Errorf("vmm: creating the %v: %w", kind, err)
	}
	v.arch.gic, v.arch.gicKind = gic, kind
	for _, f := range frames {
		addr := f.addr
		if err := gic.SetAttr(kvm.VGICGroupAddr, f.attr, &addr); err != nil {
			return fmt.Errorf("vmm: %v %s at %#x: %w", kind, f.name, addr, err)
		}
	}
	irqs := uint64(arm64.GICIRQs)
	if err := gic.SetAttr(kvm.VGICGroupNrIRQs, 0, &irqs); err != nil {
		return fmt.Errorf("vmm: %v with %d interrupts: %w", kind, irqs, err)
	}
	if err := gic.SetAttr(kvm.VGICGroupCtrl, kvm.VGICCtrlInit, nil); err != nil {
		return fmt.Errorf("vmm: initialising the %v: %w", kind, err)
	}
	return nil
}

// irqLineNumber is KVM_IRQ_LINE's irq for a GSI, which on arm64 is an SPI
// index (as irqfd's default routing takes it): the SPI's INTID, typed.
func irqLineNumber(gsi uint32) uint32 { return kvm.ARMIRQLineSPI(arm64.SPIBase + gsi) }
