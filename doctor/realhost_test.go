package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
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
		if linux.Status != StatusFail || !strings.Contains(linux.Detail, "cannot boot a Linux guest") {
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
