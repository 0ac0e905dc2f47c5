package machine

import (
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/devices/rng"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

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

// wantIRQChip is the interrupt controller the guest must report driving
// (testinit's IRQCHIP line); "" checks nothing.
func wantIRQChip(*Machine) string { return "" }
