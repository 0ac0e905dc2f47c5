package kvm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// trialARM64 is the arm64 probe's trial. arm64 has no PVM and the x86
// trial guest means nothing there: what can stop a Linux guest is a KVM
// that cannot set a VM up the way the VMM does. So, on a scratch VM, it
// asks for the preferred CPU target, initialises a vCPU with it and PSCI
// 0.2, and checks which in-kernel GIC could be created
// (KVM_CREATE_DEVICE_TEST): a GICv3, or on a host whose own GIC is a GICv2
// (a Raspberry Pi 4 or 5), a GICv2, which the VMM then uses. The first
// step that fails is the error; facts holds what the steps found.
func trialARM64(sys *System) (*ARM64Facts, error) {
	facts := &ARM64Facts{}
	if n, err := sys.CheckExtension(CapARMVMIPASize); err == nil && n > 0 {
		facts.IPABits = n
	}
	vm, err := sys.CreateVM()
	if err != nil {
		return facts, fmt.Errorf("arm64 trial: %w", err)
	}
	defer vm.Close()
	init, err := vm.ARMPreferredTarget()
	if err != nil {
		return facts, fmt.Errorf("arm64 trial: %w: KVM names no CPU model for this host's CPUs", err)
	}
	facts.Target, facts.TargetOK = init.Target, true
	if err := facts.initVCPU(vm, init); err != nil {
		return facts, err
	}
	if vm.CanCreateDevice(DeviceARMVGICv3) == nil {
		facts.GICv3 = true
	}
	if vm.CanCreateDevice(DeviceARMVGICv2) == nil {
		facts.GICv2 = true
	}
	if !facts.GICv3 && !facts.GICv2 {
		return facts, fmt.Errorf("arm64 trial: %w: this KVM can emulate neither a GICv3 nor a GICv2", unix.ENODEV)
	}
	return facts, nil
}

// initVCPU creates vCPU 0 and initialises it as the VMM does its boot CPU.
func (f *ARM64Facts) initVCPU(vm *VM, init VCPUInit) error {
	vcpu, err := vm.CreateVCPU(0)
	if err != nil {
		return fmt.Errorf("arm64 trial: %w", err)
	}
	defer vcpu.Close()
	init.SetFeature(ARMVCPUPSCI02)
	if err := vcpu.ARMInit(init); err != nil {
		return fmt.Errorf("arm64 trial: %w", err)
	}
	f.VCPUInit = true
	return nil
}
