package guestboot

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm"
)

func TestFigureLineRoundTrip(t *testing.T) {
	b := Boot{VMM: "cowork-vmm", CPUs: 2, Ready: 1500 * time.Millisecond, BootTimer: 1400 * time.Millisecond,
		Exit: 1600 * time.Millisecond, GuestUptime: 900 * time.Millisecond, GuestCPUs: "0-1"}
	got, ok := ParseFigureLine("    guestboot_test.go:42: " + b.FigureLine())
	require.True(t, ok)
	require.Equal(t, b, got)
	_, ok = ParseFigureLine("no figure here")
	require.False(t, ok)
	_, ok = ParseFigureLine("BOOTFIGURE vmm=x cpus=two")
	require.False(t, ok)
}

func TestConsoleWatcher(t *testing.T) {
	w := NewConsoleWatcher(time.Now().Add(-time.Second))
	_, _, _, ok := w.Ready()
	require.False(t, ok)
	for _, chunk := range []string{"[ 0.1] booting\r\nTESTINIT O", "K cpus=0-1 uptime=1.25\r\n", "TESTINIT DONE\r\n"} {
		_, err := w.Write([]byte(chunk))
		require.NoError(t, err)
	}
	wall, uptime, cpus, ok := w.Ready()
	require.True(t, ok)
	require.GreaterOrEqual(t, wall, time.Second)
	require.Equal(t, 1250*time.Millisecond, uptime)
	require.Equal(t, "0-1", cpus)
	require.True(t, w.Done())
	require.True(t, strings.HasPrefix(w.Console(), "[ 0.1] booting"))
}

// guestFiles returns the test guest's kernel and initramfs (EnvKernel and EnvInitrd,
// which the harness sets; else the build cache and one built here),
// skipping unless this host's KVM boots Linux (testharness/nested's
// TestNestedBootGuestKernel runs these tests in the harness elsewhere).
func guestFiles(t *testing.T) (kernelPath, initrd string) {
	t.Helper()
	nested.RequireLinuxBoot(t, "testharness/nested TestNestedBootGuestKernel")
	kernelPath, initrd = os.Getenv(EnvKernel), os.Getenv(EnvInitrd)
	if kernelPath == "" {
		var err error
		if kernelPath, err = kernel.Find(kernel.Guest); err != nil {
			t.Skipf("no guest kernel: %v", err)
		}
	}
	if initrd == "" {
		initrd = filepath.Join(t.TempDir(), "initrd.cpio.gz")
		require.NoError(t, BuildInitramfs(context.Background(), initrd))
	}
	return kernelPath, initrd
}

// TestBootQemuMicrovm times qemu -M microvm booting the test guest: the
// reference the ratio of our VMM's boot is taken against.
func TestBootQemuMicrovm(t *testing.T) {
	kernel, initrd := guestFiles(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	for _, cpus := range []int{1, 2} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		b, err := QemuMicrovm(ctx, kernel, initrd, cpus, 512, nil)
		cancel()
		require.NoError(t, err, "cpus=%d", cpus)
		t.Log(b.FigureLine())
		require.Equal(t, onlineWant(cpus), b.GuestCPUs)
	}
}

func onlineWant(cpus int) string {
	if cpus == 1 {
		return "0"
	}
	return fmt.Sprintf("0-%d", cpus-1)
}

// TestBootCoworkVMM times our VMM (package machine) booting the test guest
// with 1 and 2 vCPUs.
func TestBootCoworkVMM(t *testing.T) {
	kernel, initrd := guestFiles(t)
	for _, cpus := range []int{1, 2} {
		start := time.Now()
		watch := NewConsoleWatcher(start)
		m, err := machine.New(machine.Config{Kernel: kernel, Initrd: initrd, CPUs: cpus, MemMiB: 512, Console: watch})
		require.NoError(t, err, "cpus=%d", cpus)
		require.NoError(t, m.Start(), "cpus=%d", cpus)
		var exit vmm.Exit
		select {
		case <-m.Done():
			exit = m.Wait()
		case <-time.After(3 * time.Minute):
			t.Errorf("cpus=%d: the guest did not end within 3 minutes", cpus)
		}
		b := Boot{VMM: "cowork-vmm", CPUs: cpus, Exit: time.Since(start)}
		b.BootTimer, _ = m.BootTime()
		counters, countersErr := m.VM().VCPU(0).Counters()
		_, stopErr := m.Stop()
		require.NoError(t, stopErr)
		var ok bool
		b.Ready, b.GuestUptime, b.GuestCPUs, ok = watch.Ready()
		require.True(t, ok, "cpus=%d: testinit never reported; exit %v; console:\n%s", cpus, exit, tailLines(watch.Console(), 40))
		require.True(t, exit.Clean(), "cpus=%d: the VM ended with %v", cpus, exit)
		require.NotZero(t, b.BootTimer, "cpus=%d: the boot timer was not written", cpus)
		require.Equal(t, onlineWant(cpus), b.GuestCPUs)
		// KVM counted the boot's exits: the boot timer's port write and the
		// console's are I/O exits, the tick's interrupts injections.
		require.NoError(t, countersErr, "cpus=%d: KVM's counters", cpus)
		require.NotZero(t, counters["io_exits"], "cpus=%d: %v", cpus, counters)
		require.NotZero(t, counters["irq_injections"], "cpus=%d: %v", cpus, counters)
		require.GreaterOrEqual(t, counters["exits"], counters["io_exits"]+counters["mmio_exits"], "cpus=%d: %v", cpus, counters)
		t.Logf("cpus=%d: vCPU 0 exits %d (I/O %d, MMIO %d, halt %d, interrupt windows %d), interrupts injected %d, nested page faults %d, instructions emulated %d",
			cpus, counters["exits"], counters["io_exits"], counters["mmio_exits"], counters["halt_exits"], counters["irq_window_exits"],
			counters["irq_injections"], counters["pf_taken"], counters["insn_emulation"])
		t.Log(b.FigureLine())
	}
	nested.RecordLinuxBoot(t)
}

// TestQemuVirtArgs: qemu virt with the in-kernel GICv3 under KVM, the
// host's CPU, no firmware (-kernel boots the Image), the PL011 console.
func TestQemuVirtArgs(t *testing.T) {
	got := strings.Join(qemuVirtArgs(QemuOptions{Machine: "virt,gic-version=3", Kernel: "/p/Image", Initrd: "/p/i", CPUs: 1, MemMiB: 512, Append: "x=1"}), " ")
	require.Equal(t, "-accel kvm -M virt,gic-version=3 -cpu host -m 512 -smp 1 -nodefaults -no-user-config -nographic -serial stdio "+
		"-kernel /p/Image -initrd /p/i -append console=ttyAMA0 panic=-1 quiet x=1 -no-reboot", got)
}

// TestConsoleWatcherNotify: the callback runs once, when the ready line
// arrives, not before.
func TestConsoleWatcherNotify(t *testing.T) {
	calls := 0
	w := NewConsoleWatcherNotify(time.Now(), func() { calls++ })
	_, _ = w.Write([]byte("[ 0.1] booting\nTESTINIT O"))
	require.Zero(t, calls)
	_, _ = w.Write([]byte("K cpus=0 uptime=0.5\nTESTINIT OK again\nTESTINIT DONE\n"))
	require.Equal(t, 1, calls)
}
