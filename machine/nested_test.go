package machine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// nestedOuterAppend: see vmm's nested_test.go — without a TSC frequency the
// outer kernel's KVM never enters a guest.
const nestedOuterAppend = "tsc_early_khz=2000000"

// TestNestedKVM runs this package's KVM tests inside the nested harness
// (qemu TCG with nested SVM gives a real /dev/kvm), failing if they fail
// there: the tiny guests always, and the Linux boot (1 and 2 vCPUs) when
// our guest kernel is built (make kernel). It skips when the harness is
// unavailable, in -short mode, and on a host with /dev/kvm, where the tests
// run directly (which also keeps it from recursing inside the outer guest).
func TestNestedKVM(t *testing.T) {
	if _, err := os.Stat(kvm.DevicePath); err == nil {
		t.Skipf("%s exists here: the KVM tests run directly", kvm.DevicePath)
	}
	if testing.Short() {
		t.Skip("boots a qemu guest; skipped in -short mode")
	}
	if err := nested.Available(); err != nil {
		t.Skipf("nested harness unavailable: %v", err)
	}
	payload := t.TempDir()
	bin := filepath.Join(payload, "machine.test")
	build := exec.Command("go", "test", "-c", "-o", bin, "github.com/cowork-vmm/cowork-vmm/machine")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the tests: %v\n%s", err, out)
	}
	var env []string
	if vmlinux, err := kernel.Find(kernel.Guest); err != nil {
		t.Logf("no guest kernel (%v): the Linux boot test will skip", err)
	} else {
		initrd := filepath.Join(payload, "initrd.cpio.gz")
		if err := guestboot.BuildInitramfs(context.Background(), initrd); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(vmlinux)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(payload, "vmlinux"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		env = []string{"COWORK_TEST_KERNEL=/payload/vmlinux", "COWORK_TEST_INITRD=/payload/initrd.cpio.gz"}
	}
	res, err := nested.Run(context.Background(), nested.Options{
		PayloadDir: payload,
		Cmd:        []string{"/payload/machine.test", "-test.v", "-test.count=1", "-test.run", "^TestKVM"},
		Env:        env,
		CPUs:       2,
		Timeout:    12 * time.Minute,
		Append:     nestedOuterAppend,
	})
	if err != nil {
		t.Fatalf("nested run: %v", err)
	}
	for _, line := range strings.Split(strings.TrimRight(res.Output, "\n"), "\n") {
		t.Log(line)
	}
	if !strings.Contains(res.Output, "--- PASS") {
		t.Error("no test ran inside the nested guest")
	}
	if res.ExitCode != 0 {
		t.Errorf("the machine's KVM tests failed inside the nested guest (exit %d)", res.ExitCode)
	}
}
