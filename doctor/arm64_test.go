package doctor

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// arm64Host is healthyHost on an arm64 machine: an arm64 KVM that passed
// its trial, an arm64 cpuinfo (Features, no flags line), and the client
// gate's arm64 qemu and AAVMF firmware.
func arm64Host() *fakeHost {
	h := healthyHost()
	h.arch = "arm64"
	caps := map[string]bool{}
	for _, c := range kvm.RequiredCapabilitiesFor("arm64") {
		caps[c.String()] = true
	}
	h.kvm = kvm.HostProbe{APIVersion: kvm.APIVersion, Capabilities: caps, Tried: true,
		ARM64: &kvm.ARM64Facts{Target: 5, TargetOK: true, VCPUInit: true, GICv3: true, IPABits: 44}}
	h.files["/proc/cpuinfo"] = fakeFile{mode: 0o444, data: []byte("processor\t: 0\nBogoMIPS\t: 48.00\nFeatures\t: fp asimd evtstrm cpuid\nCPU implementer\t: 0x41\n")}
	for _, p := range []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"} {
		delete(h.files, p)
	}
	h.files["/usr/share/AAVMF/AAVMF_CODE.fd"] = fakeFile{mode: 0o644}
	h.files["/usr/share/AAVMF/AAVMF_VARS.fd"] = fakeFile{mode: 0o644}
	h.path = map[string]string{"qemu-system-aarch64": "/usr/bin/qemu-system-aarch64"}
	return h
}

// On arm64 the KVM checks report the arm64 facts: the capabilities arm64
// needs (PSCI 0.2 among them), the preferred target and the GICv3.
func TestARM64HostPasses(t *testing.T) {
	h := arm64Host()
	r := h.run(t, Options{})
	for _, c := range r.Checks {
		if c.Status == StatusFail || c.Status == StatusWarn {
			t.Errorf("%s: %s: %s (fix: %s)", c.ID, c.Status, c.Detail, c.Fix)
		}
	}
	wantUsable(t, r, BackendKVM, BackendProcess)
	caps := wantStatus(t, r, CheckKVMCaps, StatusOK)
	wantContains(t, "capabilities", caps.Detail, "KVM_CAP_ARM_PSCI_0_2", "KVM_CAP_ONE_REG", "KVM_CAP_DEVICE_CTRL")
	if strings.Contains(caps.Detail, "KVM_CAP_PIT2") {
		t.Errorf("arm64 capabilities name an x86 one: %s", caps.Detail)
	}
	linux := wantStatus(t, r, CheckKVMLinux, StatusOK)
	wantContains(t, "linux detail", linux.Detail, "target 5 (generic v8)", "PSCI 0.2", "GICv3", "44 bits")
	for _, id := range []string{CheckGateQEMU, CheckGateFirmware} {
		wantStatus(t, r, id, StatusOK)
	}
}

// A GICv2 host (a Raspberry Pi 4 or 5) passes with a GICv2, and doctor
// says so with the vCPU limit it brings.
func TestARM64GICv2HostPasses(t *testing.T) {
	h := arm64Host()
	h.kvm.ARM64.GICv3, h.kvm.ARM64.GICv2 = false, true
	r := h.run(t, Options{})
	linux := wantStatus(t, r, CheckKVMLinux, StatusOK)
	wantContains(t, "linux detail", linux.Detail, "a GICv2 (at most 8 vCPUs) can be created")
}

// The client gate on arm64 looks for qemu-system-aarch64 and the AAVMF
// pair, whatever x86 tools are installed, and names the arm64 packages.
func TestARM64ClientGate(t *testing.T) {
	h := arm64Host()
	delete(h.path, "qemu-system-aarch64")
	delete(h.files, "/usr/share/AAVMF/AAVMF_VARS.fd")
	h.path["qemu-system-x86_64"] = "/usr/bin/qemu-system-x86_64"
	h.files["/usr/share/OVMF/OVMF_CODE_4M.fd"] = fakeFile{mode: 0o644}
	h.files["/usr/share/OVMF/OVMF_VARS_4M.fd"] = fakeFile{mode: 0o644}
	r := h.run(t, Options{})
	q := wantStatus(t, r, CheckGateQEMU, StatusFail)
	wantContains(t, "qemu", q.Detail+" "+q.Fix, "qemu-system-aarch64", "apt install qemu-system-arm qemu-efi-aarch64")
	fw := wantStatus(t, r, CheckGateFirmware, StatusFail)
	wantContains(t, "firmware", fw.Detail+" "+fw.Fix, "/usr/share/AAVMF/AAVMF_CODE.fd", "apt install qemu-efi-aarch64")
	for _, c := range []Check{q, fw} {
		if strings.Contains(c.Fix, "qemu-system-x86") || strings.Contains(c.Fix, "ovmf") {
			t.Errorf("%s fix names x86 packages on arm64: %s", c.ID, c.Fix)
		}
	}
	if r.Verdict.ClientGatePasses {
		t.Error("gate said to pass with x86 tools only on arm64")
	}
}

// Without /dev/kvm an arm64 host is told about EL2, not about modules it
// does not have, and is never taken for PVM.
func TestARM64NoKVMDevice(t *testing.T) {
	h := arm64Host()
	delete(h.files, "/dev/kvm")
	h.kvm = kvm.HostProbe{OpenErr: fmt.Errorf("%w: /dev/kvm does not exist", kvm.ErrNoKVM)}
	r := h.run(t, Options{})
	dev := wantStatus(t, r, CheckKVMDevice, StatusFail)
	wantContains(t, "fix", dev.Fix, "EL2", "HYP mode not available", "COWORK_VMM_BACKEND=process")
	if strings.Contains(dev.Fix+dev.Detail, "kvm_intel") || strings.Contains(dev.Fix+dev.Detail, "vmx") {
		t.Errorf("x86 advice on arm64: %s / %s", dev.Detail, dev.Fix)
	}
	wantStatus(t, r, CheckKVMLinux, StatusSkip)
	wantUsable(t, r, BackendProcess)
	if strings.Contains(r.Verdict.Summary, "PVM") {
		t.Errorf("summary speaks of PVM on arm64: %s", r.Verdict.Summary)
	}
}

// A failed arm64 trial (no in-kernel GIC) fails the Linux check with its reason.
func TestARM64TrialFails(t *testing.T) {
	h := arm64Host()
	h.kvm.ARM64 = &kvm.ARM64Facts{Target: 5, TargetOK: true, VCPUInit: true}
	h.kvm.TrialErr = errors.New("arm64 trial: no such device: this KVM can emulate neither a GICv3 nor a GICv2")
	r := h.run(t, Options{})
	linux := wantStatus(t, r, CheckKVMLinux, StatusFail)
	wantContains(t, "linux", linux.Detail+" "+linux.Fix, "cannot boot a Linux guest", "GICv3", "COWORK_VMM_BACKEND=process")
	wantUsable(t, r, BackendProcess)
}
