package vmm

import (
	"sync/atomic"
	"testing"
	"time"
)

// A notify-style write of the registered value reaches the handler through
// the eventfd, never the bus; a write of another value to the same address
// still reaches the bus.
func TestKVMOnMMIOWriteSignalsInsteadOfExiting(t *testing.T) {
	vm := newTestVM(t, 1, 64<<10) // RAM ends at 0x10000; 0x20000 is MMIO
	defer vm.Close()
	dev := newGuestPort()
	if err := vm.MMIO().Register(0x20000, 0x1000, dev); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	called := make(chan struct{}, 1)
	if err := vm.OnMMIOWrite(0x20050, 4, 1, func() {
		calls.Add(1)
		select {
		case called <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	runDwordWrites(t, vm, 0x50, 1, 1, 1, 2)
	select {
	case <-called:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was never called for the guest's writes of 1")
	}
	if got := dev.got(); !equalAccesses(got, [][]byte{{2, 0, 0, 0}}) {
		t.Errorf("bus saw writes % x; want only the write of 2", got)
	}
	if err := vm.CloseIOEvents(); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n < 1 || n > 3 {
		t.Errorf("handler called %d times for 3 writes; want 1..3 (writes coalesce)", n)
	}
	if err := vm.OnMMIOWrite(0x20060, 4, 1, func() {}); err == nil {
		t.Error("OnMMIOWrite after CloseIOEvents succeeded")
	}
}

// An absorbed write of the registered value ends in KVM: the bus never
// sees it, and no goroutine is left behind; a write of another value to
// the same address still reaches the bus.
func TestKVMAbsorbMMIOWriteNeverReachesTheBus(t *testing.T) {
	vm := newTestVM(t, 1, 64<<10)
	defer vm.Close()
	dev := newGuestPort()
	if err := vm.MMIO().Register(0x20000, 0x1000, dev); err != nil {
		t.Fatal(err)
	}
	if err := vm.AbsorbMMIOWrite(0x20064, 4, 1); err != nil {
		t.Fatal(err)
	}
	runDwordWrites(t, vm, 0x64, 1, 1, 1, 3)
	if got := dev.got(); !equalAccesses(got, [][]byte{{3, 0, 0, 0}}) {
		t.Errorf("bus saw writes % x; want only the write of 3", got)
	}
	if err := vm.CloseIOEvents(); err != nil {
		t.Fatal(err)
	}
}

// runDwordWrites runs a real-mode guest that writes each value as a dword
// at 0x20000+offset (in MMIO above the test VM's RAM) and powers off, and
// waits for it to end.
func runDwordWrites(t *testing.T, vm *testVM, offset byte, values ...byte) {
	t.Helper()
	code := []byte{0xb8, 0x00, 0x20, 0x8e, 0xc0} // mov ax, 0x2000; mov es, ax
	for _, v := range values {
		// mov dword [es:offset], v
		code = append(code, 0x66, 0x26, 0xc7, 0x06, offset, 0x00, v, 0x00, 0x00, 0x00)
	}
	code = append(code, 0xe6, portDone, 0xeb, 0xfe) // out portDone, al; jmp $
	startRealMode(t, vm, code)
	waitPowerOff(t, vm.VM)
}
