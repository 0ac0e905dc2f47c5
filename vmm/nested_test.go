package vmm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// nestedOuterAppend is added to the outer kernel's command line. Under
// qemu's emulator the outer kernel cannot calibrate its TSC ("tsc: Unable
// to calibrate against PIT", cpu MHz 0), and a KVM whose host TSC frequency
// is unknown never enters a guest: vcpu_enter_guest retries the kvmclock
// update forever (kvm_guest_time_update returns 1 while tsc_khz is 0).
// Telling the outer kernel a frequency fixes it; the value only scales the
// outer guest's TSC clocksource.
const nestedOuterAppend = "tsc_early_khz=2000000"

// runNested builds pkg's tests (CGO_ENABLED=0) and runs those matching run
// (plus args) inside the nested harness, failing t if they fail there.
func runNested(t *testing.T, pkg, run string, args []string) {
	t.Helper()
	if err := nested.Available(); err != nil {
		t.Skipf("nested harness unavailable: %v", err)
	}
	payload := t.TempDir()
	bin := filepath.Join(payload, "pkg.test")
	build := exec.Command("go", "test", "-c", "-o", bin, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the tests of %s: %v\n%s", pkg, err, out)
	}
	cmd := append([]string{"/payload/pkg.test", "-test.v", "-test.count=1", "-test.run", run}, args...)
	res, err := nested.Run(context.Background(), nested.Options{
		PayloadDir: payload,
		Cmd:        cmd,
		CPUs:       2,
		Timeout:    8 * time.Minute,
		Append:     nestedOuterAppend,
	})
	if err != nil {
		t.Fatalf("nested run of %s: %v", pkg, err)
	}
	for _, line := range strings.Split(strings.TrimRight(res.Output, "\n"), "\n") {
		t.Log(line)
	}
	if !strings.Contains(res.Output, "--- PASS") && !strings.Contains(res.Output, "\nPASS") {
		t.Errorf("no test of %s ran inside the nested guest", pkg)
	}
	if res.ExitCode != 0 {
		t.Errorf("tests of %s failed inside the nested guest (exit %d)", pkg, res.ExitCode)
	}
}

// TestNestedKVM runs this package's and vmm/kvm's KVM tests and benchmarks
// inside the nested harness (qemu TCG with nested SVM gives a real
// /dev/kvm), failing if they fail there. It skips when the harness is
// unavailable (no qemu, no outer kernel built: make kernel), in -short
// mode, and on a host that has /dev/kvm itself, where the KVM tests run
// directly — which also keeps it from recursing inside the outer guest.
func TestNestedKVM(t *testing.T) {
	if _, err := os.Stat(kvm.DevicePath); err == nil {
		t.Skipf("%s exists here: the KVM tests run directly", kvm.DevicePath)
	}
	if testing.Short() {
		t.Skip("boots a qemu guest; skipped in -short mode")
	}
	t.Run("vmm/kvm", func(t *testing.T) {
		runNested(t, "github.com/cowork-vmm/cowork-vmm/vmm/kvm", "^TestKVM", nil)
	})
	t.Run("vmm", func(t *testing.T) {
		runNested(t, "github.com/cowork-vmm/cowork-vmm/vmm", "^TestKVM",
			[]string{"-test.bench=^BenchmarkKVM", "-test.benchtime=5x"})
	})
}
