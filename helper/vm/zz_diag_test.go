package vm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot"
)

func TestZZDiagMachineBoot(t *testing.T) {
	k := os.Getenv("COWORK_VMM_KERNEL")
	if k == "" {
		t.Skip("diag")
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio.gz")
	if err := guestboot.BuildInitramfs(context.Background(), initrd); err != nil {
		t.Fatal(err)
	}
	nested.RunGoTestWith(t, nested.GoTest{
		Pkg: "github.com/cowork-vmm/cowork-vmm/machine", Run: "^TestKVMBootLinux$",
		Files: map[string]string{"vmlinux": k, "initrd.cpio.gz": initrd},
		Env:   []string{"COWORK_TEST_KERNEL=/payload/vmlinux", "COWORK_TEST_INITRD=/payload/initrd.cpio.gz"},
		CPUs:  2, Timeout: 10 * time.Minute,
	})
}
