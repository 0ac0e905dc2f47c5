package kvm

import (
	"errors"
	"os"
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

// TestKVMProbeTrial runs the trial guest on this machine's KVM (and, in
// the nested harness, on a real one): a hardware-assisted KVM runs it, PVM
// fails it with an emulation failure on int3.
func TestKVMProbeTrial(t *testing.T) {
	p := ProbeHost(DevicePath)
	if err := p.Usable(); err != nil {
		t.Skipf("no usable KVM here (%v); the nested harness runs this test", err)
	}
	if !p.Tried {
		t.Fatal("usable KVM, but the trial guest did not run")
	}
	t.Logf("PVM marks %v (%s), trial: %v, verdict: %v", p.PVM, p.PVMReason, p.TrialErr, p.BootsLinux())
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
