package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// TestRealHost runs doctor on this machine and checks that what it reports
// about KVM matches what the machine shows.
func TestRealHost(t *testing.T) {
	var out, errOut bytes.Buffer
	code := Main(context.Background(), nil, &out, &errOut)
	t.Logf("exit %d\n%s", code, out.String())
	if errOut.Len() > 0 {
		t.Errorf("stderr: %s", errOut.String())
	}
	rep := Run(context.Background(), Options{})
	dev, ok := rep.Check(CheckKVMDevice)
	if !ok {
		t.Fatal("no kvm-device check")
	}
	_, statErr := os.Stat("/dev/kvm")
	if (statErr == nil) != (dev.Status == StatusOK) {
		t.Errorf("kvm-device says %s (%s) but stat /dev/kvm: %v", dev.Status, dev.Detail, statErr)
	}
	_, pvmErr := os.Stat("/sys/module/kvm_pvm")
	linux, _ := rep.Check(CheckKVMLinux)
	if pvmErr == nil {
		if linux.Status != StatusFail || !strings.Contains(linux.Detail, "cannot boot Linux guests") {
			t.Errorf("kvm_pvm is loaded but kvm-linux-guests says %s: %s", linux.Status, linux.Detail)
		}
		if rep.Verdict.DefaultBackendWorks && rep.Verdict.DefaultBackend == BackendKVM {
			t.Error("PVM host, yet the kvm backend is said to work")
		}
	}
	if statErr != nil && code == 0 && rep.Verdict.DefaultBackend == BackendKVM {
		t.Error("no /dev/kvm, yet exit status 0 with the kvm backend")
	}
	if code != rep.ExitCode() {
		t.Errorf("Main exit %d, report exit %d", code, rep.ExitCode())
	}

	var js bytes.Buffer
	if code := Main(context.Background(), []string{"--json"}, &js, &errOut); code != rep.ExitCode() {
		t.Errorf("--json exit %d, want %d", code, rep.ExitCode())
	}
	var decoded map[string]any
	if err := json.Unmarshal(js.Bytes(), &decoded); err != nil {
		t.Fatalf("--json output is not JSON: %v", err)
	}
}

// The real KVM probe, on device nodes every machine has.
func TestProbeKVMWithoutKVM(t *testing.T) {
	p := probeKVM("/dev/kvm-does-not-exist")
	if !errors.Is(p.OpenErr, kvm.ErrNoKVM) {
		t.Errorf("missing device: OpenErr %v, want kvm.ErrNoKVM", p.OpenErr)
	}
	if _, err := os.Stat("/dev/null"); err != nil {
		t.Skip("no /dev/null")
	}
	// /dev/null opens read-write but answers no KVM ioctl.
	p = probeKVM("/dev/null")
	if p.OpenErr != nil || p.APIErr == nil {
		t.Errorf("/dev/null: OpenErr %v, APIErr %v; want it opened and the API ioctl refused", p.OpenErr, p.APIErr)
	}
}

// On a machine with a usable /dev/kvm the probe reads version 12 and every
// capability the VMM requires.
func TestProbeKVMReal(t *testing.T) {
	if _, err := os.Stat(kvm.DevicePath); err != nil {
		t.Skipf("no %s here: %v", kvm.DevicePath, err)
	}
	p := probeKVM(kvm.DevicePath)
	if p.OpenErr != nil {
		t.Skipf("cannot open %s: %v", kvm.DevicePath, p.OpenErr)
	}
	if p.APIVersion != kvm.APIVersion || p.APIErr != nil {
		t.Errorf("API version %d (%v), want %d", p.APIVersion, p.APIErr, kvm.APIVersion)
	}
	if p.CapabilitiesErr == nil && len(p.Capabilities) != len(kvm.RequiredCapabilities) {
		t.Errorf("capabilities %v: want one entry per required capability", p.Capabilities)
	}
}
