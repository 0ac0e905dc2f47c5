package vm

import (
	"os"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// TestNestedKVMBackend runs this package's KVM tests inside the nested
// harness (qemu TCG with nested SVM: a real /dev/kvm), with our guest
// kernel and a freshly built cowork-vmm as the guest's /init. It skips
// where this host's KVM boots Linux (the tests ran directly), in -short
// mode, and where the harness or the guest kernel is unavailable.
func TestNestedKVMBackend(t *testing.T) {
	nested.RequireHarness(t)
	// COWORK_VMM_KERNEL picks the guest kernel here too; else the build cache.
	vmlinux := os.Getenv(kernel.Env)
	if vmlinux == "" {
		var err error
		if vmlinux, err = kernel.Find(kernel.Guest); err != nil {
			t.Skipf("no guest kernel: %v", err)
		}
	}
	bin := nested.BuildCoworkVMM(t)
	nested.RunGoTestWith(t, nested.GoTest{
		Pkg:   "github.com/cowork-vmm/cowork-vmm/helper/backend/vm",
		Run:   "^TestKVM",
		Files: map[string]string{"vmlinux": vmlinux, "cowork-vmm": bin},
		Env: []string{kernel.Env + "=/payload/vmlinux", TestBinEnv + "=/payload/cowork-vmm",
			"COWORK_VMM_TEST_CMDLINE=" + os.Getenv("COWORK_VMM_TEST_CMDLINE"),
			"COWORK_VMM_TEST_PVH=" + os.Getenv("COWORK_VMM_TEST_PVH")},
		// One outer CPU, so guests get one vCPU (the kvm backend caps vCPUs
		// at the host's CPUs): 2-vCPU guests under qemu's emulated nested
		// SVM are the subject of the stress target (make nested-stress);
		// one outer CPU also runs faster here.
		CPUs:    1,
		MemMiB:  2048,
		Timeout: 12 * time.Minute,
	})
}

// TestNestedARM64KVMWarmStart runs TestKVMWarmStartsDiffer (a cold boot
// that takes the first-boot snapshot, then two starts restored from it)
// inside the arm64 harness, with our arm64 guest kernel and an arm64
// cowork-vmm as the guest's /init. It skips where the arm64 harness or
// the arm64 guest kernel is missing.
func TestNestedARM64KVMWarmStart(t *testing.T) {
	nested.RequireARM64Harness(t)
	image, err := kernel.FindGuest(nested.ArchARM64)
	if err != nil {
		t.Skipf("no arm64 guest kernel: %v", err)
	}
	bin := nested.BuildCoworkVMMArch(t, nested.ArchARM64)
	nested.RunGoTestWith(t, nested.GoTest{
		Arch:    nested.ArchARM64,
		Pkg:     "github.com/cowork-vmm/cowork-vmm/helper/backend/vm",
		Run:     "^TestKVMWarmStartsDiffer$",
		Files:   map[string]string{"Image": image, "cowork-vmm": bin},
		Env:     []string{kernel.Env + "=/payload/Image", TestBinEnv + "=/payload/cowork-vmm"},
		CPUs:    1,
		MemMiB:  2048,
		Timeout: 12 * time.Minute,
	})
}
