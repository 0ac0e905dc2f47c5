package machine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/rng"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
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

// realModeAt points vCPU 0 at rip in real mode with flat zero segments.
func realModeAt(t *testing.T, vm *vmm.VM, rip uint64) {
	t.Helper()
	c := vm.VCPU(0)
	s, err := c.GetSregs()
	if err != nil {
		t.Fatal(err)
	}
	for _, seg := range []*kvm.Segment{&s.CS, &s.DS, &s.ES, &s.FS, &s.GS, &s.SS} {
		seg.Base, seg.Selector = 0, 0
	}
	if err := c.SetSregs(s); err != nil {
		t.Fatal(err)
	}
	if err := c.SetRegs(kvm.Regs{RIP: rip, RFLAGS: 2, RSP: 0x8000}); err != nil {
		t.Fatal(err)
	}
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

// A tiny real-mode guest prints on the console through the 8250, writes the
// boot timer and resets the machine through the i8042.
func TestKVMConsoleBootTimerAndReset(t *testing.T) {
	nested.RequireKVM(t)
	console := &syncBuffer{}
	m, err := assemble(Config{MemMiB: 2, Console: console, Logger: quietLogger(), SkipBootProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop()
	code := []byte{
		0xba, 0xf8, 0x03, // mov dx, 0x3f8
		0xb0, 'h', 0xee, // mov al, 'h'; out dx, al
		0xb0, 'i', 0xee, // mov al, 'i'; out dx, al
		0xb0, '\n', 0xee, // mov al, '\n'; out dx, al
		0xba, 0xf0, 0x03, // mov dx, 0x3f0
		0xb0, 123, 0xee, // mov al, 123; out dx, al   (boot timer)
		0xb0, 0xfe, 0xe6, 0x64, // mov al, 0xfe; out 0x64, al (i8042: pulse reset)
		0xeb, 0xfe, // jmp $
	}
	if err := m.VM().Memory().WriteAt(code, 0x1000); err != nil {
		t.Fatal(err)
	}
	realModeAt(t, m.VM(), 0x1000)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	e := waitDone(t, m)
	if e.Kind != vmm.ExitReset {
		t.Fatalf("exit %v, want a reset", e)
	}
	if got := console.String(); got != "hi\n" {
		t.Errorf("console %q, want %q", got, "hi\n")
	}
	if d, ok := m.BootTime(); !ok || d <= 0 {
		t.Errorf("boot time %v, %v", d, ok)
	}
	if e, err := m.Stop(); err != nil || e.Kind != vmm.ExitReset {
		t.Errorf("Stop after the guest ended: %v, %v", e, err)
	}
}

func TestKVMVirtioMMIOSlots(t *testing.T) {
	nested.RequireKVM(t)
	m, err := assemble(Config{MemMiB: 16, Logger: quietLogger(), SkipBootProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop()
	for i := 0; i < 2; i++ {
		if _, err := m.AddVirtioMMIO(rng.New(quietLogger())); err != nil {
			t.Fatal(err)
		}
	}
	cmdline := m.Cmdline()
	for _, want := range []string{"virtio_mmio.device=4K@0xd0000000:5", "virtio_mmio.device=4K@0xd0001000:6"} {
		if !strings.Contains(cmdline, want) {
			t.Errorf("cmdline %q lacks %q", cmdline, want)
		}
	}
	magic := make([]byte, 4)
	m.VM().MMIO().Read(0xd000_1000, magic)
	if string(magic) != "virt" {
		t.Errorf("magic at the second slot % x", magic)
	}
	if err := m.startVCPUs(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddVirtioMMIO(rng.New(quietLogger())); err == nil {
		t.Error("AddVirtioMMIO after Start accepted")
	}
	_ = virtio.MMIOSize
}

func TestKVMStopBeforeStartReleasesEverything(t *testing.T) {
	nested.RequireKVM(t)
	m, err := assemble(Config{MemMiB: 2, Logger: quietLogger(), SkipBootProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	e, err := m.Stop()
	if err != nil || e.Kind != vmm.ExitStopped {
		t.Fatalf("Stop: %v, %v", e, err)
	}
	if err := m.Start(); err == nil {
		t.Error("Start after Stop accepted")
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
			t.Logf("exit: %v; wall %v; boot timer %v (%v)", e, time.Since(start).Round(time.Millisecond), bootTime, booted)
			if !strings.Contains(console.String(), "TESTINIT OK") {
				t.Errorf("the test init never ran")
			}
			if !booted {
				t.Error("the guest never wrote the boot timer")
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
		if err := guestboot.BuildInitramfs(context.Background(), initrdPath); err != nil {
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
