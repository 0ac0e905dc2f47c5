package vmm

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// counterGuest is real-mode code that counts in AX forever, writing each
// count to portData (a 16-bit out, so every count is an exit).
var counterGuest = []byte{
	0xba, portData, 0x00, // mov dx, portData
	0x31, 0xc0, // xor ax, ax
	0x40,       // loop: inc ax
	0xef,       // out dx, ax
	0xeb, 0xfc, // jmp loop
}

// lastCount returns how many counts the guest wrote and the last one.
func lastCount(p *guestPort) (int, uint16) {
	w := p.got()
	if len(w) == 0 {
		return 0, 0
	}
	return len(w), binary.LittleEndian.Uint16(w[len(w)-1])
}

// waitCounts waits until the guest has written at least n counts.
func waitCounts(t *testing.T, p *guestPort, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if got, _ := lastCount(p); got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest wrote fewer than %d counts in a minute", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// pausedCounter runs counterGuest in a VM of mem bytes until it has
// written three counts, and pauses it.
func pausedCounter(t *testing.T, mem uint64) *testVM {
	t.Helper()
	vm := newTestVM(t, 1, mem)
	load(t, vm.Memory(), codeAddr, counterGuest)
	realMode(t, vm.VCPU(0), codeAddr)
	if err := vm.Start(); err != nil {
		vm.Close()
		t.Fatal(err)
	}
	waitCounts(t, vm.data, 3)
	if err := vm.Pause(); err != nil {
		vm.Close()
		t.Fatal(err)
	}
	return vm
}

// A paused VM holds still, and goes on from the same count after Resume;
// its state and memory, given to a fresh VM, make that VM go on from the
// same count too: no count lost, none written twice (a vCPU paused right
// after an exit must not be saved with that OUT half done).
func TestKVMPauseSaveAndRestoreState(t *testing.T) {
	const mem = 1 << 20
	vm := pausedCounter(t, mem)
	defer vm.Close()
	n, last := lastCount(vm.data)
	time.Sleep(20 * time.Millisecond)
	if n2, _ := lastCount(vm.data); n2 != n {
		t.Fatalf("a paused guest wrote %d more counts", n2-n)
	}
	state, err := vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	image := make([]byte, mem)
	if err := vm.Memory().ReadAt(image, 0); err != nil {
		t.Fatal(err)
	}

	vm.Resume()
	waitCounts(t, vm.data, n+1)
	if w := vm.data.got(); binary.LittleEndian.Uint16(w[n]) != last+1 {
		t.Errorf("after Resume the guest wrote %d, want %d", binary.LittleEndian.Uint16(w[n]), last+1)
	}
	if _, err := vm.Stop(); err != nil {
		t.Fatal(err)
	}

	restored := newTestVM(t, 1, mem)
	defer restored.Close()
	load(t, restored.Memory(), 0, image)
	if err := restored.RestoreState(state); err != nil {
		t.Fatal(err)
	}
	if err := restored.Start(); err != nil {
		t.Fatal(err)
	}
	waitCounts(t, restored.data, 1)
	if first := binary.LittleEndian.Uint16(restored.data.got()[0]); first != last+1 {
		t.Errorf("the restored guest first wrote %d, want %d", first, last+1)
	}
	if _, err := restored.Stop(); err != nil {
		t.Fatal(err)
	}
}

// A snapshot file of a paused VM restores into a fresh VM, memory mapped
// from the file, that goes on with the next count; a snapshot of another
// identity is refused.
func TestKVMSnapshotFileRestores(t *testing.T) {
	const mem = 2 << 20
	vm := pausedCounter(t, mem)
	defer vm.Close()
	_, last := lastCount(vm.data)
	id := snapshot.Identity{Build: "test", Kernel: "none", MemoryBytes: mem, CPUs: 1}
	path := filepath.Join(t.TempDir(), "vm.snap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.WriteSnapshot(f, id); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Stop(); err != nil {
		t.Fatal(err)
	}

	if _, err := snapshot.Open(path, snapshot.Identity{Build: "other", Kernel: "none", MemoryBytes: mem, CPUs: 1}); !errors.Is(err, snapshot.ErrMismatch) {
		t.Errorf("a snapshot of another build opened: %v", err)
	}
	sf, err := snapshot.Open(path, id)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := RestoreSnapshot(Config{MemoryBytes: mem, CPUs: 1, Logger: quietLogger()}, sf)
	sf.Close() // the mapping holds the file
	if err != nil {
		t.Fatal(err)
	}
	restored := withTestPorts(t, raw)
	defer restored.Close()
	if err := restored.Start(); err != nil {
		t.Fatal(err)
	}
	waitCounts(t, restored.data, 2)
	w := restored.data.got()
	if first, second := binary.LittleEndian.Uint16(w[0]), binary.LittleEndian.Uint16(w[1]); first != last+1 || second != last+2 {
		t.Errorf("the restored guest wrote %d, %d; want %d, %d", first, second, last+1, last+2)
	}
	if _, err := restored.Stop(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || len(got) == 0 {
		t.Errorf("the snapshot file after restore: %d bytes, %v", len(got), err)
	}
	if _, err := snapshot.Open(path, id); err != nil {
		t.Errorf("the guest's writes reached the snapshot file (MAP_PRIVATE): %v", err)
	}
}

// Pause refuses a VM that never started, and SaveState one not paused.
func TestKVMPauseNeedsARunningVM(t *testing.T) {
	vm := newTestVM(t, 1, 1<<20)
	defer vm.Close()
	if err := vm.Pause(); err == nil {
		t.Error("Pause of a VM that never started succeeded")
	}
	if _, err := vm.SaveState(); err == nil {
		t.Error("SaveState of a VM that is not paused succeeded")
	}
}
