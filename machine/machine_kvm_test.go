package machine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// syncBuffer is a console sink safe for the UART's flush goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func waitDone(t *testing.T, m *Machine) vmm.Exit {
	t.Helper()
	select {
	case <-m.Done():
		return m.Wait()
	case <-time.After(3 * time.Minute):
		m.Stop()
		t.Fatal("the guest did not end within 3 minutes")
		return vmm.Exit{}
	}
}

// TestKVMBootLinux boots our guest kernel with the test init (it prints
// TESTINIT OK, writes the boot timer and restarts) on 1 and 2 vCPUs, where
// this host's KVM boots Linux (TestNestedKVM runs it in the harness
// elsewhere). Kernel and initramfs come from COWORK_TEST_KERNEL and
// COWORK_TEST_INITRD (the harness sets them), else the build cache and a
// test initramfs built here.
func TestKVMBootLinux(t *testing.T) {
	nested.RequireLinuxBoot(t, "TestNestedKVM")
	kernelPath, initrdPath := testBootImages(t)
	for _, cpus := range []int{1, 2} {
		t.Run(map[int]string{1: "1cpu", 2: "2cpus"}[cpus], func(t *testing.T) {
			console := &syncBuffer{}
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			start := time.Now()
			m, err := New(Config{Kernel: kernelPath, Initrd: initrdPath, MemMiB: 256, CPUs: cpus,
				Console: io.MultiWriter(console, testLogWriter{t}), Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Start(); err != nil {
				m.Stop()
				t.Fatal(err)
			}
			select {
			case <-m.Done():
			case <-ctx.Done():
			}
			bootTime, booted := m.BootTime()
			e, err := m.Stop()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("exit: %v; wall %v; boot timer %v (%v); interrupt controller %q; host pages of %d bytes",
				e, time.Since(start).Round(time.Millisecond), bootTime, booted, wantIRQChip(m), os.Getpagesize())
			if !strings.Contains(console.String(), "TESTINIT OK") {
				t.Errorf("the test init never ran")
			}
			if !booted {
				t.Error("the guest never wrote the boot timer")
			}
			if chip := wantIRQChip(m); chip != "" && !strings.Contains(console.String(), "TESTINIT IRQCHIP "+chip) {
				t.Errorf("the guest does not drive the VM's interrupt controller, a %s", chip)
			}
			if e.Kind != vmm.ExitReset && e.Kind != vmm.ExitTripleFault {
				t.Errorf("exit %v, want the guest's restart", e)
			}
			// testinit reports /sys/devices/system/cpu/online ("unknown"
			// when it could not read it).
			if out := console.String(); cpus == 2 && !strings.Contains(out, "cpus=0-1") && !strings.Contains(out, "cpus=unknown") {
				t.Errorf("the guest did not bring up its second CPU")
			}
			t.Logf("BOOT-FIGURE cpus=%d boot_timer_ms=%.1f", cpus, float64(bootTime)/float64(time.Millisecond))
			if !t.Failed() {
				nested.RecordLinuxBoot(t)
			}
		})
	}
}

// testBootImages returns the guest kernel and test initramfs to boot, or
// skips when no kernel is built.
func testBootImages(t *testing.T) (kernelPath, initrdPath string) {
	t.Helper()
	kernelPath, initrdPath = os.Getenv("COWORK_TEST_KERNEL"), os.Getenv("COWORK_TEST_INITRD")
	if kernelPath == "" {
		var err error
		if kernelPath, err = kernel.Find(kernel.Guest); err != nil {
			t.Skipf("no guest kernel (%v): make kernel builds it", err)
		}
	}
	if initrdPath == "" {
		initrdPath = filepath.Join(t.TempDir(), "initrd.cpio.gz")
		if err := guestboot.BuildInitramfsFor(context.Background(), initrdPath, runtime.GOARCH); err != nil {
			t.Fatal(err)
		}
	}
	return kernelPath, initrdPath
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Logf("console: %s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

func TestKVMRunKernelRejectsBadImage(t *testing.T) {
	nested.RequireKVM(t)
	_, err := RunKernel(context.Background(), Config{KernelImage: []byte("not a kernel at all"), MemMiB: 16,
		Logger: quietLogger(), SkipBootProbe: true})
	if err == nil || !strings.Contains(err.Error(), "loading the kernel") {
		t.Fatalf("bad image: %v", err)
	}
	if errors.Is(err, kvm.ErrCannotBootLinux) {
		t.Fatal("the boot probe ran although SkipBootProbe was set")
	}
}
