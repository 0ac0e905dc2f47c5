package vmm

import (
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// TestNestedKVM runs this package's and vmm/kvm's KVM tests and benchmarks
// inside the nested harness (qemu TCG with nested SVM gives a real
// /dev/kvm), failing if they fail there. On a PVM host the tiny guests also
// run directly, but some exits (the triple fault) only a hardware-assisted
// KVM gives. It skips where this KVM boots Linux (the tests ran directly),
// in -short mode, and where the harness is unavailable.
func TestNestedKVM(t *testing.T) {
	nested.RequireHarness(t)
	t.Run("vmm/kvm", func(t *testing.T) {
		nested.RunGoTestWith(t, nested.GoTest{Pkg: "github.com/cowork-vmm/cowork-vmm/vmm/kvm", Run: "^TestKVM",
			CPUs: 2, Timeout: 8 * time.Minute})
	})
	t.Run("vmm", func(t *testing.T) {
		nested.RunGoTestWith(t, nested.GoTest{Pkg: "github.com/cowork-vmm/cowork-vmm/vmm", Run: "^TestKVM",
			Args: []string{"-test.bench=^BenchmarkKVM", "-test.benchtime=5x"}, CPUs: 2, Timeout: 8 * time.Minute})
	})
}

// TestNestedARM64KVM runs this package's arm64 KVM tests (TestKVMARM64…:
// a tiny guest's state saved and restored) inside the arm64 harness
// (qemu-system-aarch64 TCG at EL2 gives a real arm64 /dev/kvm). It skips
// where the arm64 harness is unavailable.
func TestNestedARM64KVM(t *testing.T) {
	nested.RequireARM64Harness(t)
	nested.RunGoTestWith(t, nested.GoTest{Arch: nested.ArchARM64, Pkg: "github.com/cowork-vmm/cowork-vmm/vmm",
		Run: "^TestKVMARM64", CPUs: 2, Timeout: 8 * time.Minute})
}
