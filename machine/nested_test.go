package machine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// TestNestedKVM runs this package's KVM tests inside the nested harness
// (qemu TCG with nested SVM gives a real /dev/kvm), failing if they fail
// there: the tiny guests always, and the Linux boot (1 and 2 vCPUs) when
// our guest kernel is built (make kernel). It skips where this host's KVM
// boots Linux (the tests ran directly), in -short mode and where the
// harness is unavailable.
func TestNestedKVM(t *testing.T) {
	nested.RequireHarness(t)
	files := map[string]string{}
	var env []string
	if vmlinux, err := kernel.Find(kernel.Guest); err != nil {
		t.Logf("no guest kernel (%v): the Linux boot test will skip", err)
	} else {
		initrd := filepath.Join(t.TempDir(), "initrd.cpio.gz")
		if err := guestboot.BuildInitramfs(context.Background(), initrd); err != nil {
			t.Fatal(err)
		}
		files["vmlinux"], files["initrd.cpio.gz"] = vmlinux, initrd
		env = []string{"COWORK_TEST_KERNEL=/payload/vmlinux", "COWORK_TEST_INITRD=/payload/initrd.cpio.gz"}
	}
	nested.RunGoTestWith(t, nested.GoTest{
		Pkg:     "github.com/cowork-vmm/cowork-vmm/machine",
		Run:     "^TestKVM",
		Files:   files,
		Env:     env,
		CPUs:    2,
		Timeout: 12 * time.Minute,
	})
}

// TestNestedARM64KVM runs TestKVMBootLinux (our arm64 guest kernel with
// the test init, on 1 and 2 vCPUs: the device tree, the GICv3, PSCI's
// CPU_ON and SYSTEM_RESET, the 16550 on MMIO, the boot timer's MMIO page)
// inside the arm64 harness (qemu-system-aarch64 TCG at EL2 gives a real
// arm64 /dev/kvm). It skips where the arm64 harness or the arm64 guest
// kernel (make kernel-arm64) is missing.
func TestNestedARM64KVM(t *testing.T) {
	runNestedARM64(t, "^TestKVMBootLinux$", nested.GoTest{})
}

// TestNestedARM64KVMGICv2 runs TestKVMBootLinux and the snapshot tests
// in the arm64 harness with a GICv2 in the outer guest, as a Raspberry Pi
// 4 or 5 has: its KVM can give our guest only a GICv2, which the VMM then
// creates, the device tree announces, the guest drives (testinit's
// IRQCHIP line) and a snapshot saves and restores.
func TestNestedARM64KVMGICv2(t *testing.T) {
	runNestedARM64(t, "^(TestKVMBootLinux|TestKVMSnapshotRestoresALinuxGuest.*)$", nested.GoTest{GICv2: true})
}

// TestNestedARM64KVMPages16K runs TestKVMBootLinux and the snapshot tests
// in the arm64 harness whose outer kernel has 16 KiB pages, as Apple
// Silicon under Asahi Linux and a Raspberry Pi 5 under Raspberry Pi OS
// have: our VMM's RAM, memory slots and snapshots on such a host, under a
// guest with 4 KiB pages. It skips where that kernel is not built (make
// kernel-outer-16k-arm64).
func TestNestedARM64KVMPages16K(t *testing.T) {
	nested.RequireARM64Pages16K(t)
	res := runNestedARM64(t, "^(TestKVMBootLinux|TestKVMSnapshotRestoresALinuxGuest.*)$", nested.GoTest{Pages16K: true})
	if !t.Failed() && !strings.Contains(res.Output, "host pages of 16384 bytes") {
		t.Error("the outer guest's pages are not 16 KiB")
	}
}

// TestNestedARM64KVMSnapshot runs TestKVMSnapshotRestoresALinuxGuest
// (and its 2-vCPU variant) in the arm64 harness: an arm64 guest's
// registers, GICv3 and virtual counter saved mid-run and restored into a
// new VM, which goes on ticking. It skips as TestNestedARM64KVM does.
func TestNestedARM64KVMSnapshot(t *testing.T) {
	runNestedARM64(t, "^TestKVMSnapshotRestoresALinuxGuest", nested.GoTest{})
}

// runNestedARM64 runs this package's tests matching run in the arm64
// harness, with our arm64 guest kernel and the test init; variant's GICv2
// and Pages16K choose the outer guest's.
func runNestedARM64(t *testing.T, run string, variant nested.GoTest) nested.Result {
	nested.RequireARM64Harness(t)
	image, err := kernel.FindGuest(nested.ArchARM64)
	if err != nil {
		t.Skipf("no arm64 guest kernel: %v", err)
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio.gz")
	if err := guestboot.BuildInitramfsFor(context.Background(), initrd, nested.ArchARM64); err != nil {
		t.Fatal(err)
	}
	return nested.RunGoTestWith(t, nested.GoTest{
		Arch:     nested.ArchARM64,
		Pkg:      "github.com/cowork-vmm/cowork-vmm/machine",
		Run:      run,
		Files:    map[string]string{"Image": image, "initrd.cpio.gz": initrd},
		Env:      []string{"COWORK_TEST_KERNEL=/payload/Image", "COWORK_TEST_INITRD=/payload/initrd.cpio.gz"},
		CPUs:     2,
		Timeout:  15 * time.Minute,
		GICv2:    variant.GICv2,
		Pages16K: variant.Pages16K,
	})
}
