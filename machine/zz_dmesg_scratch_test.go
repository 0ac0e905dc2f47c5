package machine

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot"
)

// SCRATCH (H15): compare dmesg of our VMM and qemu microvm. Removed after use.
func TestScratchNestedDmesg(t *testing.T) {
	if os.Getenv("H15_SCRATCH") == "" {
		t.Skip("scratch")
	}
	vmlinux, err := kernel.Find(kernel.Guest)
	if err != nil {
		t.Skip(err)
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio.gz")
	if err := guestboot.BuildInitramfs(context.Background(), initrd); err != nil {
		t.Fatal(err)
	}
	nested.RunGoTestWith(t, nested.GoTest{
		Pkg:   "github.com/cowork-vmm/cowork-vmm/machine",
		Run:   "^TestScratchInnerDmesg$",
		Files: map[string]string{"vmlinux": vmlinux, "initrd.cpio.gz": initrd},
		Env:   []string{"H15_INNER=1", "H15_EXTRA=" + os.Getenv("H15_EXTRA"), "H15_CPUS=" + os.Getenv("H15_CPUS"), "H15_QEMU=" + os.Getenv("H15_QEMU")},
		Timeout: 15 * time.Minute,
	})
}

func TestScratchInnerDmesg(t *testing.T) {
	if os.Getenv("H15_INNER") == "" {
		t.Skip("scratch")
	}
	extra := "loglevel=7 printk.time=1 " + os.Getenv("H15_EXTRA")
	cpus, _ := strconv.Atoi(os.Getenv("H15_CPUS"))
	if cpus == 0 {
		cpus = 1
	}
	var out bytes.Buffer
	start := time.Now()
	m, err := New(Config{Kernel: "/payload/vmlinux", Initrd: "/payload/initrd.cpio.gz", CPUs: cpus, MemMiB: 512, Console: &out,
		Cmdline: strings.ReplaceAll(extra, "quiet", "")})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(3 * time.Minute):
	}
	m.Stop()
	t.Logf("OURS wall %v\n%s", time.Since(start), out.String())
	if os.Getenv("H15_QEMU") == "" {
		return
	}
	out.Reset()
	start = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-enable-kvm", "-M", "microvm", "-cpu", "host",
		"-m", "512", "-smp", strconv.Itoa(cpus), "-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio",
		"-kernel", "/payload/vmlinux", "-initrd", "/payload/initrd.cpio.gz", "-append",
		"console=ttyS0 panic=-1 pci=off no_timer_check reboot=t "+extra, "-no-reboot")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Run()
	t.Logf("QEMU wall %v\n%s", time.Since(start), out.String())
}
