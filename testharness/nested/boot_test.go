package nested

import (
	"bufio"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
)

// TestNestedBootGuestKernel boots our guest kernel with testinit inside the
// outer guest, on our VMM (1 and 2 vCPUs) and on qemu -M microvm, and
// reports the boot figures and their ratio.
func TestNestedBootGuestKernel(t *testing.T) {
	res := runGuestbootTest(t, "^TestBoot", 15*time.Minute)

	figures := map[string]map[int]guestboot.Boot{}
	sc := bufio.NewScanner(strings.NewReader(res.Output))
	for sc.Scan() {
		if b, ok := guestboot.ParseFigureLine(sc.Text()); ok {
			if figures[b.VMM] == nil {
				figures[b.VMM] = map[int]guestboot.Boot{}
			}
			figures[b.VMM][b.CPUs] = b
		}
	}
	require.NotEmpty(t, figures["qemu-microvm"], "qemu microvm reported no boot figure")
	for _, cpus := range []int{1, 2} {
		q, haveQemu := figures["qemu-microvm"][cpus]
		ours, haveOurs := figures["cowork-vmm"][cpus]
		switch {
		case haveOurs && haveQemu:
			t.Logf("cpus=%d: cowork-vmm ready %v (boot timer %v, guest uptime %v), qemu microvm ready %v (guest uptime %v): ratio ours/qemu %.2f",
				cpus, ours.Ready.Round(time.Millisecond), ours.BootTimer.Round(time.Millisecond), ours.GuestUptime,
				q.Ready.Round(time.Millisecond), q.GuestUptime, float64(ours.Ready)/float64(q.Ready))
		case haveQemu:
			t.Logf("cpus=%d: qemu microvm ready %v (guest uptime %v, exit %v); no cowork-vmm figure (see the inner test's skip reason)",
				cpus, q.Ready.Round(time.Millisecond), q.GuestUptime, q.Exit.Round(time.Millisecond))
		}
	}
}

// runGuestbootTest runs the guestboot package's tests matching run inside
// the outer guest, with the guest kernel and testinit's initramfs in the
// payload, or skips when the harness or the kernel is missing.
func runGuestbootTest(t *testing.T, run string, timeout time.Duration, env ...string) Result {
	t.Helper()
	return runTestGuestTests(t, "github.com/cowork-vmm/cowork-vmm/testharness/guestboot", run, timeout, env...)
}

// runTestGuestTests is runGuestbootTest for the tests of another package
// that boots the test guest (guestboot/fsrun).
func runTestGuestTests(t *testing.T, pkg, run string, timeout time.Duration, env ...string) Result {
	t.Helper()
	RequireHarness(t)
	guestKernel, err := kernel.Find(kernel.Guest)
	if err != nil {
		t.Skipf("guest kernel: %v", err)
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio.gz")
	require.NoError(t, guestboot.BuildInitramfs(context.Background(), initrd))
	return RunGoTestWith(t, GoTest{
		Pkg: pkg,
		Run: run,
		Files: map[string]string{
			"vmlinux":        guestKernel,
			"initrd.cpio.gz": initrd,
		},
		Env: append([]string{
			guestboot.EnvKernel + "=/payload/vmlinux",
			guestboot.EnvInitrd + "=/payload/initrd.cpio.gz",
		}, env...),
		Timeout: timeout,
	})
}

// arm64BenchMarker is guestboot's ARM64BenchMarker (an external test's
// constant, which this package cannot import).
const arm64BenchMarker = "ARM64BOOT "

// TestNestedARM64BootGuestKernel runs guestboot's TestBootARM64Bench in
// the arm64 harness: the arm64 guest kernel with testinit on our VMM and
// on qemu-system-aarch64 -M virt -accel kvm, interleaved, with the ready
// time, the KVM exits and the VMM CPU time of each, and records the
// summary and the ratios ours/qemu as figures.
func TestNestedARM64BootGuestKernel(t *testing.T) {
	RequireARM64Harness(t)
	guestKernel, err := kernel.FindGuest(ArchARM64)
	if err != nil {
		t.Skipf("arm64 guest kernel: %v", err)
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio.gz")
	require.NoError(t, guestboot.BuildInitramfsFor(context.Background(), initrd, ArchARM64))
	res := RunGoTestWith(t, GoTest{
		Arch: ArchARM64,
		Pkg:  "github.com/cowork-vmm/cowork-vmm/testharness/guestboot",
		Run:  "^TestBootARM64Bench$",
		Files: map[string]string{
			"Image":          guestKernel,
			"initrd.cpio.gz": initrd,
		},
		Env: []string{
			guestboot.EnvKernel + "=/payload/Image",
			guestboot.EnvInitrd + "=/payload/initrd.cpio.gz",
		},
		Timeout: 20 * time.Minute,
	})
	figures := FiguresIn(res.Output, arm64BenchMarker)
	require.NotEmpty(t, figures, "the bench reported no figures")
	RecordFigures(t, figures...)
}
