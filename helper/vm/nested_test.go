package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// TestNestedKVMBackend runs this package's KVM tests inside the nested
// harness (qemu TCG with nested SVM: a real /dev/kvm), with our guest
// kernel and a freshly built cowork-vmm as the guest's /init. It skips when
// the harness or the guest kernel is unavailable, and where /dev/kvm exists
// (the tests then run directly; this also stops recursion in the harness).
func TestNestedKVMBackend(t *testing.T) {
	if _, err := os.Stat(kvm.DevicePath); err == nil {
		t.Skipf("%s exists here: the KVM tests run directly", kvm.DevicePath)
	}
	if testing.Short() {
		t.Skip("boots a qemu guest; skipped in -short mode")
	}
	if err := nested.Available(); err != nil {
		t.Skipf("nested harness unavailable: %v", err)
	}
	// COWORK_VMM_KERNEL picks the guest kernel here too; else the build cache.
	vmlinux := os.Getenv("COWORK_VMM_KERNEL")
	if vmlinux == "" {
		var err error
		if vmlinux, err = kernel.Find(kernel.Guest); err != nil {
			t.Skipf("no guest kernel: %v", err)
		}
	}
	bin := filepath.Join(t.TempDir(), "cowork-vmm")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/cowork-vmm/cowork-vmm/cmd/cowork-vmm")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building cowork-vmm: %v\n%s", err, out)
	}
	nested.RunGoTestWith(t, nested.GoTest{
		Pkg:   "github.com/cowork-vmm/cowork-vmm/helper/vm",
		Run:   "^TestKVM",
		Files: map[string]string{"vmlinux": vmlinux, "cowork-vmm": bin},
		Env: []string{KernelEnv + "=/payload/vmlinux", TestBinEnv + "=/payload/cowork-vmm",
			"COWORK_VMM_TEST_CMDLINE=" + os.Getenv("COWORK_VMM_TEST_CMDLINE"),
			"COWORK_VMM_TEST_PVH=" + os.Getenv("COWORK_VMM_TEST_PVH")},
		// One outer CPU, so guests get one vCPU (the kvm backend caps vCPUs
		// at the host's CPUs): 2-vCPU guests triple-fault intermittently
		// under qemu's emulated nested SVM (cause not yet known; see the
		// VM backend issue's note), and one outer CPU also runs faster here.
		CPUs:    1,
		MemMiB:  2048,
		Timeout: 12 * time.Minute,
	})
}
