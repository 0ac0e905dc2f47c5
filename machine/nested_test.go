package machine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// TestNestedKVM runs this package's KVM tests inside the nested harness
// (qemu TCG with nested SVM gives a real /dev/kvm), failing if they fail
// there: the tiny guests always, and the Linux boot (1 and 2 vCPUs) when
// our guest kernel is built (make kernel). It skips when the harness is
// unavailable, and on a host with /dev/kvm, where the tests run directly
// (which also keeps it from recursing inside the outer guest).
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
	gt := nested.GoTest{
		Pkg:     "github.com/cowork-vmm/cowork-vmm/machine",
		Run:     "^TestKVM",
		CPUs:    2,
		Timeout: 12 * time.Minute,
	}
	if vmlinux, err := kernel.Find(kernel.Guest); err != nil {
		t.Logf("no guest kernel (%v): the Linux boot test will skip", err)
	} else {
		initrd := filepath.Join(t.TempDir(), "initrd.cpio.gz")
		if err := guestboot.BuildInitramfs(context.Background(), initrd); err != nil {
			t.Fatal(err)
		}
		gt.Files = map[string]string{"vmlinux": vmlinux, "initrd.cpio.gz": initrd}
		gt.Env = []string{"COWORK_TEST_KERNEL=/payload/vmlinux", "COWORK_TEST_INITRD=/payload/initrd.cpio.gz"}
	}
	nested.RunGoTestWith(t, gt)
}
