package kvm

import (
	"errors"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// The probe on device nodes every machine has.
func TestProbeHostWithoutKVM(t *testing.T) {
	p := ProbeHost("/dev/kvm-does-not-exist")
	if !errors.Is(p.OpenErr, ErrNoKVM) || p.Tried {
		t.Errorf("missing device: OpenErr %v, tried %v; want ErrNoKVM and no trial", p.OpenErr, p.Tried)
	}
	if err := p.BootsLinux(); !errors.Is(err, ErrCannotBootLinux) || !errors.Is(err, ErrNoKVM) {
		t.Errorf("missing device: BootsLinux %v, want ErrCannotBootLinux wrapping ErrNoKVM", err)
	}
	if pvm, why := IsPVM(); p.PVM != pvm || p.PVMReason != why {
		t.Errorf("PVM marks %v %q without a device, IsPVM says %v %q", p.PVM, p.PVMReason, pvm, why)
	}
	if _, err := os.Stat("/dev/null"); err != nil {
		t.Skip("no /dev/null")
	}
	// /dev/null opens read-write but answers no KVM ioctl.
	p = ProbeHost("/dev/null")
	if p.OpenErr != nil || p.APIErr == nil || p.Tried {
		t.Errorf("/dev/null: OpenErr %v, APIErr %v, tried %v; want it opened, the API ioctl refused, no trial", p.OpenErr, p.APIErr, p.Tried)
	}
	if err := p.BootsLinux(); !errors.Is(err, ErrCannotBootLinux) {
		t.Errorf("/dev/null: BootsLinux %v", err)
	}
}

// The verdict from each combination of facts.
func TestHostProbeVerdict(t *testing.T) {
	all := map[string]bool{}
	for _, c := range RequiredCapabilities {
		all[c.String()] = true
	}
	noExit := map[string]bool{}
	for k, v := range all {
		noExit[k] = v
	}
	noExit[CapImmediateExit.String()] = false
	trialFailed := errors.New("its instruction emulator cannot execute int3")
	for _, tc := range []struct {
		name   string
		probe  HostProbe
		usable bool
		boots  bool
		want   []string // in BootsLinux's error
	}{
		{"hardware KVM", HostProbe{APIVersion: APIVersion, Capabilities: all, Tried: true}, true, true, nil},
		{"PVM", HostProbe{APIVersion: APIVersion, Capabilities: all, Tried: true, TrialErr: trialFailed, PVM: true, PVMReason: "the kvm_pvm module is loaded"},
			true, false, []string{"PVM", "kvm_pvm", "int3"}},
		{"trial fails without PVM marks", HostProbe{APIVersion: APIVersion, Capabilities: all, Tried: true, TrialErr: trialFailed}, true, false, []string{"int3"}},
		{"PVM marks, trial passes", HostProbe{APIVersion: APIVersion, Capabilities: all, Tried: true, PVM: true}, true, true, nil},
		{"not tried", HostProbe{APIVersion: APIVersion, Capabilities: all}, true, false, []string{"not run"}},
		{"old API", HostProbe{Device: "/dev/kvm", APIVersion: 11}, false, false, []string{"API version 11"}},
		{"missing capability", HostProbe{APIVersion: APIVersion, Capabilities: noExit}, false, false, []string{"KVM_CAP_IMMEDIATE_EXIT"}},
		{"permission", HostProbe{OpenErr: ErrKVMPermission}, false, false, []string{"permission"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.probe.Usable() == nil; got != tc.usable {
				t.Errorf("usable %v, want %v (%v)", got, tc.usable, tc.probe.Usable())
			}
			err := tc.probe.BootsLinux()
			if (err == nil) != tc.boots {
				t.Fatalf("BootsLinux %v, want boots=%v", err, tc.boots)
			}
			if err != nil && !errors.Is(err, ErrCannotBootLinux) {
				t.Errorf("%v does not wrap ErrCannotBootLinux", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
}

// TestKVMProbeTrial runs the trial on this machine's KVM (and, in the
// nested harness, on a real one): a hardware-assisted x86 KVM runs the
// trial guest, PVM fails it with an emulation failure on int3; an arm64
// KVM gives a target, initialises a vCPU and can create a GICv3.
func TestKVMProbeTrial(t *testing.T) {
	p := ProbeHost(DevicePath)
	if err := p.Usable(); err != nil {
		t.Skipf("no usable KVM here (%v); the nested harness runs this test", err)
	}
	if !p.Tried {
		t.Fatal("usable KVM, but the trial guest did not run")
	}
	t.Logf("PVM marks %v (%s), trial: %v, arm64 facts: %+v, verdict: %v", p.PVM, p.PVMReason, p.TrialErr, p.ARM64, p.BootsLinux())
	if runtime.GOARCH == "arm64" {
		if p.PVM || p.TrialErr != nil || p.ARM64 == nil || !p.ARM64.TargetOK || !p.ARM64.VCPUInit || !p.ARM64.GICv3 {
			t.Errorf("arm64 KVM: PVM %v, trial %v, facts %+v; want no PVM, the trial passed, every fact true", p.PVM, p.TrialErr, p.ARM64)
		}
		return
	}
	if p.PVM {
		if !errors.Is(p.TrialErr, errTrialEmulation) {
			t.Errorf("PVM: trial %v, want the int3 emulation failure", p.TrialErr)
		}
		return
	}
	if p.TrialErr != nil {
		t.Errorf("hardware-assisted KVM failed the trial guest: %v", p.TrialErr)
	}
}

// The trial leaves no descriptor behind: the helper probes on every startVM.
func TestKVMProbeReleasesEverything(t *testing.T) {
	if err := ProbeHost(DevicePath).Usable(); err != nil {
		t.Skipf("no usable KVM here: %v", err)
	}
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	for range 20 {
		ProbeHost(DevicePath)
	}
	if after := fds(); after != before {
		t.Errorf("descriptors %d before 20 probes, %d after", before, after)
	}
}

// The amd64 list is the one the VMM always had; the arm64 list holds only
// capabilities 6.1's arm64 KVM reports (kvm_vm_ioctl_check_extension in
// arch/arm64/kvm/arm.c, and the generic ones of virt/kvm/kvm_main.c).
func TestRequiredCapabilitiesPerArchitecture(t *testing.T) {
	amd64 := []Capability{CapIRQChip, CapUserMemory, CapSetTSSAddr, CapSetIdentityMapAddr,
		CapExtCPUID, CapPIT2, CapMPState, CapIRQFD, CapImmediateExit}
	if got := RequiredCapabilitiesFor("amd64"); !slices.Equal(got, amd64) {
		t.Errorf("amd64: %v, want %v", got, amd64)
	}
	arm64Reports := map[Capability]bool{
		CapIRQChip: true, CapIOEventFD: true, CapDeviceCtrl: true, CapUserMemory: true,
		CapSyncMMU: true, CapOneReg: true, CapARMPSCI: true, CapARMPSCI02: true,
		CapReadonlyMem: true, CapMPState: true, CapImmediateExit: true, CapVCPUEvents: true,
		CapVCPUAttributes: true, CapNrVCPUs: true, CapMaxVCPUs: true, CapARMPMUv3: true,
		CapARMVMIPASize: true, CapARMSVE: true, CapIRQFD: true, CapIRQRouting: true,
	}
	arm64 := RequiredCapabilitiesFor("arm64")
	for _, c := range arm64 {
		if !arm64Reports[c] {
			t.Errorf("arm64 requires %v, which arm64 KVM never reports", c)
		}
	}
	for _, c := range []Capability{CapOneReg, CapDeviceCtrl, CapARMPSCI02, CapIRQFD, CapImmediateExit} {
		if !slices.Contains(arm64, c) {
			t.Errorf("arm64 list %v lacks %v", arm64, c)
		}
	}
	if got := RequiredCapabilitiesFor("riscv64"); got != nil {
		t.Errorf("riscv64: %v, want none (unsupported)", got)
	}
	if runtime.GOARCH == "amd64" && !slices.Equal(RequiredCapabilities, amd64) {
		t.Errorf("RequiredCapabilities on amd64: %v", RequiredCapabilities)
	}
}

// On arm64 the verdict comes from the arm64 capabilities and trial; the
// x86 ones mean nothing there.
func TestHostProbeVerdictARM64(t *testing.T) {
	const noneDropped = Capability(1 << 31)
	caps := func(drop Capability) map[string]bool {
		m := map[string]bool{}
		for _, c := range RequiredCapabilitiesFor("arm64") {
			m[c.String()] = c != drop
		}
		return m
	}
	x86Caps := map[string]bool{}
	for _, c := range RequiredCapabilitiesFor("amd64") {
		x86Caps[c.String()] = true
	}
	facts := &ARM64Facts{Target: 5, TargetOK: true, VCPUInit: true, GICv3: true}
	noGIC := errors.New("arm64 trial: KVM_CREATE_DEVICE (test) type 7: no such device: this KVM cannot emulate a GICv3")
	for _, tc := range []struct {
		name   string
		probe  HostProbe
		usable bool
		boots  bool
		want   []string
	}{
		{"arm64 KVM", HostProbe{Arch: "arm64", APIVersion: APIVersion, Capabilities: caps(noneDropped), Tried: true, ARM64: facts}, true, true, nil},
		{"no GICv3", HostProbe{Arch: "arm64", APIVersion: APIVersion, Capabilities: caps(noneDropped), Tried: true, TrialErr: noGIC}, true, false, []string{"GICv3"}},
		{"not tried", HostProbe{Arch: "arm64", APIVersion: APIVersion, Capabilities: caps(noneDropped)}, true, false, []string{"arm64 trial", "GICv3"}},
		{"no PSCI 0.2", HostProbe{Arch: "arm64", APIVersion: APIVersion, Capabilities: caps(CapARMPSCI02)}, false, false, []string{"KVM_CAP_ARM_PSCI_0_2"}},
		{"x86 capabilities only", HostProbe{Arch: "arm64", APIVersion: APIVersion, Capabilities: x86Caps}, false, false, []string{"KVM_CAP_ONE_REG", "KVM_CAP_DEVICE_CTRL"}},
		{"unsupported architecture", HostProbe{Arch: "riscv64", APIVersion: APIVersion, Tried: true}, false, false, []string{"riscv64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.probe.Usable() == nil; got != tc.usable {
				t.Errorf("usable %v, want %v (%v)", got, tc.usable, tc.probe.Usable())
			}
			err := tc.probe.BootsLinux()
			if (err == nil) != tc.boots {
				t.Fatalf("BootsLinux %v, want boots=%v", err, tc.boots)
			}
			for _, w := range tc.want {
				if !errors.Is(err, ErrCannotBootLinux) || !strings.Contains(err.Error(), w) {
					t.Errorf("%v lacks %q or ErrCannotBootLinux", err, w)
				}
			}
		})
	}
}
