package nested

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot"
)

func TestZZManualBoot(t *testing.T) {
	k, err := kernel.Find(kernel.Outer)
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio.gz")
	if err := guestboot.BuildInitramfs(context.Background(), initrd); err != nil {
		t.Fatal(err)
	}
	RunGoTestWith(t, GoTest{
		Pkg: "github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot", Run: "^TestBoot",
		Files: map[string]string{"vmlinux": k, "initrd.cpio.gz": initrd},
		Env:   []string{guestboot.EnvKernel + "=/payload/vmlinux", guestboot.EnvInitrd + "=/payload/initrd.cpio.gz"},
		CPUs:  2, Timeout: 10 * time.Minute,
	})
}
