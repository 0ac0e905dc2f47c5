package vmm

import (
	"encoding/binary"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"golang.org/x/sys/unix"
)

// These tests run tiny guests, assembled here as bytes, on the real KVM.
// They skip without a usable KVM; the nested harness runs them too
// (TestNestedKVM), on a hardware-assisted KVM.

// Ports the test guests use.
// Each decodes 4 ports, so 16- and 32-bit accesses are fully inside it.
const (
	portData   = 0x10 // echo device: records writes, answers reads with 0x99…
	portReport = 0x14 // records what the guest found
	portDone   = 0x18 // ends the VM (power-off)
	portHello  = 0x1c // per-vCPU hello in the SMP test
	portSize   = 4
)

// codeAddr is where test code is loaded, dataAddr holds its data.
const (
	codeAddr = 0x1000
	dataAddr = 0x2000
)

// guestPort is a port device that records every access, answers reads
// with 0x99, 0x9a, … and can signal the first write.
type guestPort struct {
	mu       sync.Mutex
	writes   [][]byte
	reads    int
	wrote    chan struct{}
	onWrite  func(data []byte)
	signaled bool
}

func newGuestPort() *guestPort { return &guestPort{wrote: make(chan struct{})} }

func (p *guestPort) Read(_ uint64, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range data {
		data[i] = 0x99 + byte(p.reads)
		p.reads++
	}
}

func (p *guestPort) Write(_ uint64, data []byte) {
	p.mu.Lock()
	p.writes = append(p.writes, append([]byte(nil), data...))
	if !p.signaled {
		p.signaled = true
		close(p.wrote)
	}
	f := p.onWrite
	p.mu.Unlock()
	if f != nil {
		f(data)
	}
}

func (p *guestPort) got() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.writes...)
}

// testVM is a VM with the three test ports registered.
type testVM struct {
	*VM
	data, report *guestPort
}

func newTestVM(t testing.TB, cpus int, mem uint64) *testVM {
	t.Helper()
	nested.RequireKVM(t)
	vm, err := New(Config{MemoryBytes: mem, CPUs: cpus, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return withTestPorts(t, vm)
}

// withTestPorts registers the test ports on vm.
func withTestPorts(t testing.TB, vm *VM) *testVM {
	t.Helper()
	tv := &testVM{VM: vm, data: newGuestPort(), report: newGuestPort()}
	done := newGuestPort()
	done.onWrite = func([]byte) { vm.RequestExit(Exit{Kind: ExitPowerOff, VCPU: -1, Detail: "test guest done"}) }
	for port, d := range map[uint64]Device{portData: tv.data, portReport: tv.report, portDone: done} {
		if err := vm.PIO().Register(port, portSize, d); err != nil {
			t.Fatal(err)
		}
	}
	return tv
}

// realMode puts vCPU i in real mode at address rip (CS base 0).
func realMode(t testing.TB, c *kvm.VCPU, rip uint64) {
	t.Helper()
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

func load(t testing.TB, m *Memory, gpa uint64, b []byte) {
	t.Helper()
	if err := m.WriteAt(b, gpa); err != nil {
		t.Fatal(err)
	}
}

// waitExit waits for the VM to end, failing the test with the vCPUs'
// state after a generous bound (the nested harness is slow) rather than
// hanging.
func waitExit(t testing.TB, vm *VM) Exit {
	t.Helper()
	select {
	case <-vm.Done():
		return vm.Wait()
	case <-time.After(time.Minute):
		vm.RequestExit(Exit{Kind: ExitStopped, VCPU: -1})
		vm.Wait()
		t.Fatalf("guest did not finish within a minute; stats %+v\nvCPU 0:\n%s", vm.Stats(), vm.DumpVCPU(0))
		return Exit{}
	}
}

// startRealMode loads code at codeAddr and starts the VM with vCPU 0 on
// it in real mode.
func startRealMode(t testing.TB, vm *testVM, code []byte) {
	t.Helper()
	load(t, vm.Memory(), codeAddr, code)
	realMode(t, vm.VCPU(0), codeAddr)
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
}

// waitPowerOff waits for the guest to power off (its write to portDone),
// failing the test on any other end.
func waitPowerOff(t testing.TB, vm *VM) {
	t.Helper()
	if e := waitExit(t, vm); e.Kind != ExitPowerOff {
		t.Fatalf("exit %v", e)
	}
}

// waitWrote waits for the guest's first write to p.
func waitWrote(t testing.TB, p *guestPort) {
	t.Helper()
	select {
	case <-p.wrote:
	case <-time.After(2 * time.Minute):
		t.Fatal("the guest never wrote to its port")
	}
}

func TestKVMRealModePortIO(t *testing.T) {
	vm := newTestVM(t, 1, 1<<20)
	defer vm.Close()
	code := []byte{
		0xba, portData, 0x00, // mov dx, 0x10
		0xb0, 0x42, // mov al, 0x42
		0xee,             // out dx, al
		0xec,             // in al, dx          (device answers 0x99)
		0xe6, portReport, // out portReport, al
		0xb8, 0x34, 0x12, // mov ax, 0x1234
		0xef,             // out dx, ax      (16-bit write)
		0xed,             // in ax, dx       (16-bit read: 0x9a, 0x9b)
		0xe7, portReport, // out portReport, ax
		0xbe, dataAddr & 0xff, dataAddr >> 8, // mov si, 0x2000
		0xb9, 0x05, 0x00, // mov cx, 5
		0xfc,       // cld
		0xf3, 0x6e, // rep outsb          (string I/O: 5 accesses)
		0xbf, 0x00, 0x30, // mov di, 0x3000
		0xb9, 0x03, 0x00, // mov cx, 3
		0xf3, 0x6c, // rep insb           (3 reads into 0x3000)
		0xe6, portDone, // out portDone, al
		0xeb, 0xfe, // jmp $
	}
	load(t, vm.Memory(), dataAddr, []byte("hello"))
	startRealMode(t, vm, code)
	waitPowerOff(t, vm.VM)
	want := [][]byte{{0x42}, {0x34, 0x12}, {'h'}, {'e'}, {'l'}, {'l'}, {'o'}}
	if got := vm.data.got(); !equalAccesses(got, want) {
		t.Errorf("data port writes %q, want %q", got, want)
	}
	if got := vm.report.got(); !equalAccesses(got, [][]byte{{0x99}, {0x9a, 0x9b}}) {
		t.Errorf("reported reads % x", got)
	}
	in := make([]byte, 3)
	if err := vm.Memory().ReadAt(in, 0x3000); err != nil || string(in) != "\x9c\x9d\x9e" {
		t.Errorf("rep insb stored % x, %v", in, err)
	}
}

func equalAccesses(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if string(a[i]) != string(b[i]) {
			return false
		}
	}
	return true
}

func TestKVMRealModeMMIO(t *testing.T) {
	vm := newTestVM(t, 1, 64<<10) // RAM ends at 0x10000; 0x20000 is MMIO
	defer vm.Close()
	dev := newGuestPort()
	if err := vm.MMIO().Register(0x20000, 0x1000, dev); err != nil {
		t.Fatal(err)
	}
	code := []byte{
		0xb8, 0x00, 0x20, // mov ax, 0x2000
		0x8e, 0xc0, // mov es, ax
		0x26, 0xc6, 0x06, 0x10, 0x00, 0x5a, // mov byte [es:0x10], 0x5a
		0x66, 0x26, 0xa1, 0x20, 0x00, // mov eax, [es:0x20]
		0x66, 0xe7, portReport, // out portReport, eax
		0x26, 0xa0, 0x00, 0x08, // mov al, [es:0x800]  (unclaimed? no: inside the device)
		0xb8, 0x00, 0x30, // mov ax, 0x3000      (0x30000: nothing there)
		0x8e, 0xc0, // mov es, ax
		0x66, 0x26, 0xa1, 0x00, 0x00, // mov eax, [es:0]  (unclaimed MMIO reads 0)
		0x66, 0xe7, portReport, // out portReport, eax
		0xe6, portDone, // out portDone, al
		0xeb, 0xfe, // jmp $
	}
	startRealMode(t, vm, code)
	waitPowerOff(t, vm.VM)
	if got := dev.got(); !equalAccesses(got, [][]byte{{0x5a}}) {
		t.Errorf("MMIO writes % x", got)
	}
	if got := vm.report.got(); !equalAccesses(got, [][]byte{{0x99, 0x9a, 0x9b, 0x9c}, {0, 0, 0, 0}}) {
		t.Errorf("MMIO reads reported % x", got)
	}
}

// longMode sets up identity paging for the first 2 MiB and for
// 0xd0000000..0xd0200000, a flat 64-bit GDT, and enters long mode at rip.
func longMode(t testing.TB, m *Memory, c *kvm.VCPU, rip uint64) {
	t.Helper()
	const gdt, pml4, pdpt, pdLow, pdHigh = 0x500, 0x9000, 0xa000, 0xb000, 0xc000
	put := func(gpa, v uint64) {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		load(t, m, gpa, b[:])
	}
	put(gdt, 0)
	put(gdt+8, 0x00af9b000000ffff)  // 64-bit code
	put(gdt+16, 0x00cf93000000ffff) // data
	put(pml4, pdpt|3)
	put(pdpt, pdLow|3)
	put(pdpt+3*8, pdHigh|3)
	put(pdLow, 0x83)                     // 0..2 MiB
	put(pdHigh+0x80*8, 0xd000_0000|0x83) // 0xd0000000..+2 MiB
	s, err := c.GetSregs()
	if err != nil {
		t.Fatal(err)
	}
	code := kvm.Segment{Limit: 0xffffffff, Selector: 8, Type: 11, Present: 1, S: 1, L: 1, G: 1}
	data := kvm.Segment{Limit: 0xffffffff, Selector: 16, Type: 3, Present: 1, S: 1, DB: 1, G: 1}
	s.CS = code
	s.DS, s.ES, s.FS, s.GS, s.SS = data, data, data, data, data
	s.GDT = kvm.DTable{Base: gdt, Limit: 23}
	s.CR3 = pml4
	s.CR4 = 1 << 5                   // PAE
	s.CR0 = 1<<31 | 1<<16 | 1<<4 | 1 // PG, WP, ET, PE
	s.EFER = 1<<8 | 1<<10            // LME, LMA
	if err := c.SetSregs(s); err != nil {
		t.Fatal(err)
	}
	if err := c.SetRegs(kvm.Regs{RIP: rip, RFLAGS: 2, RSP: 0x8000}); err != nil {
		t.Fatal(err)
	}
}

func TestKVMLongModePortIOAndMMIO(t *testing.T) {
	vm := newTestVM(t, 1, 2<<20)
	defer vm.Close()
	dev := newGuestPort()
	if err := vm.MMIO().Register(0xd000_0000, 0x1000, dev); err != nil {
		t.Fatal(err)
	}
	code := []byte{
		0xba, portData, 0, 0, 0, // mov edx, 0x10
		0xb0, 0x42, // mov al, 0x42
		0xee,                         // out dx, al
		0xbb, 0x00, 0x00, 0x00, 0xd0, // mov ebx, 0xd0000000
		0xc7, 0x43, 0x10, 0x0d, 0xf0, 0xfe, 0xca, // mov dword [rbx+0x10], 0xcafef00d
		0x8b, 0x43, 0x20, // mov eax, [rbx+0x20]
		0xe7, portReport, // out portReport, eax
		0xe6, portDone, // out portDone, al
		0xeb, 0xfe, // jmp $
	}
	load(t, vm.Memory(), codeAddr, code)
	longMode(t, vm.Memory(), vm.VCPU(0), codeAddr)
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	waitPowerOff(t, vm.VM)
	if got := vm.data.got(); !equalAccesses(got, [][]byte{{0x42}}) {
		t.Errorf("port writes % x", got)
	}
	if got := dev.got(); !equalAccesses(got, [][]byte{{0x0d, 0xf0, 0xfe, 0xca}}) {
		t.Errorf("MMIO writes % x", got)
	}
	if got := vm.report.got(); !equalAccesses(got, [][]byte{{0x99, 0x9a, 0x9b, 0x9c}}) {
		t.Errorf("MMIO read reported % x", got)
	}
}

func TestKVMTwoVCPUsRunCode(t *testing.T) {
	vm := newTestVM(t, 2, 1<<20)
	defer vm.Close()
	hello := newGuestPort()
	var mu sync.Mutex
	seen := map[byte]bool{}
	hello.onWrite = func(b []byte) {
		mu.Lock()
		seen[b[0]] = true
		all := len(seen) == 2
		mu.Unlock()
		if all {
			vm.RequestExit(Exit{Kind: ExitPowerOff, VCPU: -1})
		}
	}
	if err := vm.PIO().Register(portHello, portSize, hello); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		addr := uint64(codeAddr + 0x100*i)
		load(t, vm.Memory(), addr, []byte{0xb0, byte(0xa0 + i), 0xe6, portHello, 0xeb, 0xfe}) // mov al, id; out; jmp $
		c := vm.VCPU(i)
		if i > 0 {
			// APs start waiting for INIT/SIPI; make this one runnable directly.
			if err := c.SetMPState(kvm.MPStateRunnable); err != nil {
				t.Fatal(err)
			}
		}
		realMode(t, c, addr)
	}
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	waitPowerOff(t, vm.VM)
	mu.Lock()
	defer mu.Unlock()
	if !seen[0xa0] || !seen[0xa1] {
		t.Errorf("vCPUs heard from: %v", seen)
	}
}

func TestKVMStopSpinningAndHaltedGuests(t *testing.T) {
	for name, code := range map[string][]byte{
		"spinning": {0xe6, portData, 0xeb, 0xfe},             // out 0x10, al; jmp $
		"halted":   {0xe6, portData, 0xfa, 0xf4, 0xeb, 0xfd}, // out; cli; hlt; jmp back to hlt
	} {
		t.Run(name, func(t *testing.T) {
			vm := newTestVM(t, 2, 1<<20)
			startRealMode(t, vm, code)
			waitWrote(t, vm.data)
			e, err := vm.Stop()
			if err != nil {
				t.Fatal(err)
			}
			if e.Kind != ExitStopped {
				t.Fatalf("exit %v, want stopped", e)
			}
			if err := vm.Memory().ReadAt(make([]byte, 1), 0); err == nil {
				t.Error("memory still readable after Stop")
			}
		})
	}
}

// The Go runtime's preemption signal (SIGURG, which sysmon sends to a
// thread long in one system call) does not take a vCPU out of the guest;
// the kick still does, from the guest's code and from its halt.
func TestKVMOnlyTheKickInterruptsTheGuest(t *testing.T) {
	for name, code := range map[string][]byte{
		"spinning": {0xe6, portData, 0xeb, 0xfe},
		"halted":   {0xe6, portData, 0xfa, 0xf4, 0xeb, 0xfd},
	} {
		t.Run(name, func(t *testing.T) {
			vm := newTestVM(t, 1, 1<<20)
			startRealMode(t, vm, code)
			waitWrote(t, vm.data)
			vt := vm.vcpus[0]
			vt.mu.Lock()
			tid := vt.tid
			vt.mu.Unlock()
			before := vm.Stats().Interrupted
			for range 20 {
				if err := unix.Tgkill(unix.Getpid(), tid, unix.SIGURG); err != nil {
					t.Fatal(err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if n := vm.Stats().Interrupted - before; n != 0 {
				t.Errorf("20 SIGURGs interrupted the guest %d times; want 0", n)
			}
			e, err := vm.Stop()
			if err != nil {
				t.Fatal(err)
			}
			if e.Kind != ExitStopped {
				t.Fatalf("exit %v, want stopped", e)
			}
		})
	}
}

// strayDelivery is what the triple-fault guest's IVT points every vector
// at: a CPU that delivers an exception through the IVT although the IDT
// limit is 0 (PVM's instruction emulator does) reports it and powers off,
// instead of spinning through zeroed memory.
const (
	strayHandlerAddr = 0x0500
	strayReport      = 0xee
)

func TestKVMTripleFault(t *testing.T) {
	vm := newTestVM(t, 1, 1<<20)
	defer vm.Close()
	ivt := make([]byte, 256*4)
	for v := range 256 {
		binary.LittleEndian.PutUint16(ivt[4*v:], strayHandlerAddr) // offset; segment 0
	}
	load(t, vm.Memory(), 0, ivt)
	load(t, vm.Memory(), strayHandlerAddr, []byte{
		0xb0, strayReport, // mov al, 0xee
		0xe6, portReport, // out portReport, al
		0xe6, portDone, // out portDone, al
		0xf4, // hlt
	})
	load(t, vm.Memory(), codeAddr, []byte{0x0f, 0x0b}) // ud2, with no IDT: #UD -> #DF -> triple fault
	c := vm.VCPU(0)
	realMode(t, c, codeAddr)
	s, err := c.GetSregs()
	if err != nil {
		t.Fatal(err)
	}
	s.IDT = kvm.DTable{Base: 0, Limit: 0}
	if err := c.SetSregs(s); err != nil {
		t.Fatal(err)
	}
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	e := waitExit(t, vm.VM)
	if got := vm.report.got(); len(got) > 0 && got[0][0] == strayReport {
		t.Skipf("this KVM delivered #UD through the real-mode IVT although the IDT limit is 0 (exit %v): "+
			"it cannot give a triple fault here; the nested harness runs this test on a hardware-assisted KVM", e)
	}
	if e.Kind != ExitTripleFault || e.VCPU != 0 {
		t.Fatalf("exit %v, want a triple fault on vCPU 0", e)
	}
	t.Logf("triple fault report:\n%s", e.Detail)
}

func TestKVMIRQLineTriggers(t *testing.T) {
	vm := newTestVM(t, 1, 1<<20)
	line, err := vm.IRQLine(5)
	if err != nil {
		t.Fatal(err)
	}
	if err := line.Trigger(); err != nil {
		t.Fatal(err)
	}
	if err := vm.LevelIRQLine(6).Trigger(); err != nil {
		t.Fatal(err)
	}
	if err := vm.Close(); err != nil {
		t.Fatal(err)
	}
	if err := line.Trigger(); err != ErrIRQClosed {
		t.Errorf("Trigger after Close: %v", err)
	}
}

func countFDs(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func TestKVMNoLeaksOver50StartStopCycles(t *testing.T) {
	nested.RequireKVM(t)
	cycle := func() {
		vm := newTestVM(t, 2, 1<<20)
		if _, err := vm.IRQLine(4); err != nil {
			t.Fatal(err)
		}
		if err := vm.OnMMIOWrite(0x20050, 4, 0, func() {}); err != nil {
			t.Fatal(err)
		}
		startRealMode(t, vm, []byte{0xe6, portData, 0xeb, 0xfe})
		waitWrote(t, vm.data)
		if _, err := vm.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // warm up lazily created runtime state
	fds, goroutines := countFDs(t), runtime.NumGoroutine()
	for i := 0; i < 50; i++ {
		cycle()
	}
	if got := countFDs(t); got != fds {
		t.Errorf("open fds %d after 50 cycles, %d before", got, fds)
	}
	// The Done-closer goroutine may need a moment to be reaped by the scheduler.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := runtime.NumGoroutine(); got > goroutines {
		t.Errorf("%d goroutines after 50 cycles, %d before", got, goroutines)
	}
}
