package vmm

import (
	"testing"
	"time"
)

// A spinning guest's exit count moves (host timer interrupts take its vCPU
// out of KVM_RUN): what the helper reads to tell a busy guest from a dead
// one.
func TestKVMExitsMoveWhileTheGuestSpins(t *testing.T) {
	vm := newTestVM(t, 2, 1<<20)
	startRealMode(t, vm, []byte{0xe6, portData, 0xeb, 0xfe}) // out 0x10, al; jmp $
	waitWrote(t, vm.data)
	before, err := vm.Exits()
	if err != nil {
		t.Skipf("no KVM binary statistics here (Linux 5.14): %v", err)
	}
	var after uint64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if after, err = vm.Exits(); err != nil {
			t.Fatal(err)
		}
		if after > before {
			break
		}
	}
	if after <= before {
		t.Fatalf("exits stayed at %d for 5 s while the guest spun", before)
	}
	if _, err := vm.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Exits(); err == nil {
		t.Error("Exits of a stopped VM gave no error")
	}
}
