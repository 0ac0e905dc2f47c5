package vmm

import (
	"os"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// TestNestedKVM runs this package's and vmm/kvm's KVM tests and benchmarks
// inside the nested harness (qemu TCG with nested SVM gives a real
// /dev/kvm), failing if they fail there. It skips when the harness is
// unavailable (no qemu, no outer kernel built: make kernel), and on a host
// that has /dev/kvm itself, where the KVM tests run directly — which is
// also what keeps it from recursing inside the outer guest.
func TestNestedKVM(t *testing.T) {
	if _, err := os.Stat(kvm.DevicePath); err == nil {
		t.Skipf("%s exists here: the KVM tests run directly", kvm.DevicePath)
	}
	if testing.Short() {
		t.Skip("boots a qemu guest; skipped in -short mode")
	}
	for _, pkg := range []string{
		"github.com/cowork-vmm/cowork-vmm/vmm/kvm",
		"github.com/cowork-vmm/cowork-vmm/vmm",
	} {
		t.Run(pkg, func(t *testing.T) {
			nested.RunGoTestWith(t, nested.GoTest{
				Pkg:     pkg,
				Run:     "^TestKVM",
				Args:    []string{"-test.bench=^BenchmarkKVM", "-test.benchtime=5x"},
				CPUs:    2,
				Timeout: 8 * time.Minute,
			})
		})
	}
}
