package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/internal/nested"
)

func TestH14TmpNestedEgress(t *testing.T) {
	vmlinux, err := kernel.Find(kernel.Guest)
	if err != nil {
		t.Skip(err)
	}
	bin := filepath.Join(t.TempDir(), "cowork-vmm")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "../cmd/cowork-vmm")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	nested.RunGoTestWith(t, nested.GoTest{
		Pkg:   "github.com/cowork-vmm/cowork-vmm/e2e",
		Run:   "^TestEgressAllowedDomains$",
		Files: map[string]string{"vmlinux": vmlinux, "cowork-vmm": bin},
		Env:   []string{"COWORK_VMM_E2E_BACKEND=kvm", "COWORK_VMM_E2E_BIN=/payload/cowork-vmm", "COWORK_VMM_KERNEL=/payload/vmlinux"},
		CPUs:  2, MemMiB: 3072, Timeout: 10 * time.Minute,
	})
}
