package vmm

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// counterAddr is an MMIO address free in vmm/arm64's layout, where
// armCounterGuest stores its counts.
const counterAddr = 0x1000_0000

// armCounterGuest counts in x0 forever, storing each count to counterAddr
// (an MMIO exit each).
var armCounterGuest = []uint32{
	0xd2a20001, // movz x1, #0x1000, lsl #16
	0xd2800000, // movz x0, #0
	0x91000400, // loop: add x0, x0, #1
	0xf9000020, // str x0, [x1]
	0x17fffffe, // b loop
}

// counterDevice records the counts the guest stores.
type counterDevice struct {
	mu     sync.Mutex
	counts []uint64
}

func (d *counterDevice) Read(uint64, []byte) {}

func (d *counterDevice) Write(_ uint64, data []byte) {
	var b [8]byte
	copy(b[:], data)
	d.mu.Lock()
	d.counts = append(d.counts, binary.LittleEndian.Uint64(b[:]))
	d.mu.Unlock()
}

// waitCount waits until the guest has stored n counts and returns them.
func (d *counterDevice) waitCount(t *testing.T, n int) []uint64 {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		d.mu.Lock()
		got := append([]uint64(nil), d.counts...)
		d.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest stored %d counts in 2 minutes, want %d", len(got), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// newCounterVM is a VM of 2 vCPUs with the counter device, vCPU 1
// powered off as createVCPUs leaves it.
func newCounterVM(t *testing.T) (*VM, *counterDevice) {
	t.Helper()
	nested.RequireKVM(t)
	vm, err := New(Config{MemoryBytes: 16 << 20, CPUs: 2, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	d := &counterDevice{}
	if err := vm.MMIO().Register(counterAddr, 8, d); err != nil {
		vm.Close()
		t.Fatal(err)
	}
	return vm, d
}

// An arm64 VM paused mid-count, saved (through gob, as a snapshot holds
// it) and restored into a fresh VM with its memory, goes on from the next
// count; its powered-off secondary stays off; and saving the restored VM
// gives back every register and GIC word it was given, but for the count,
// the PC and the virtual counter, which ran on: KVM took each one back.
func TestKVMARM64SaveAndRestoreState(t *testing.T) {
	vm, dev := newCounterVM(t)
	defer vm.Close()
	code := make([]byte, 4*len(armCounterGuest))
	for i, w := range armCounterGuest {
		binary.LittleEndian.PutUint32(code[4*i:], w)
	}
	if err := vm.Memory().WriteAt(code, arm64.RAMBase); err != nil {
		t.Fatal(err)
	}
	if err := vm.SetBootEntry(0, arm64.RAMBase, 0); err != nil {
		t.Fatal(err)
	}
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	dev.waitCount(t, 3)
	if err := vm.Pause(); err != nil {
		t.Fatal(err)
	}
	saved, err := vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	counts := dev.waitCount(t, 0)
	last := counts[len(counts)-1]
	image := make([]byte, len(code))
	if err := vm.Memory().ReadAt(image, arm64.RAMBase); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Stop(); err != nil {
		t.Fatal(err)
	}
	var enc bytes.Buffer
	if err := gob.NewEncoder(&enc).Encode(saved); err != nil {
		t.Fatal(err)
	}
	t.Logf("state of 2 vCPUs (%d registers each) and the GIC: %d bytes gob-encoded", len(saved.ARM64.VCPUs[0].Regs), enc.Len())
	var state State
	if err := gob.NewDecoder(&enc).Decode(&state); err != nil {
		t.Fatal(err)
	}

	restored, dev2 := newCounterVM(t)
	defer restored.Close()
	if err := restored.Memory().WriteAt(image, arm64.RAMBase); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := restored.RestoreState(&state); err != nil {
		t.Fatal(err)
	}
	t.Logf("RestoreState took %v", time.Since(began))
	if err := restored.Start(); err != nil {
		t.Fatal(err)
	}
	if first := dev2.waitCount(t, 1)[0]; first != last+1 {
		t.Errorf("the restored guest first stored %d, want %d", first, last+1)
	}
	if err := restored.Pause(); err != nil {
		t.Fatal(err)
	}
	again, err := restored.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	compareARM64States(t, saved.ARM64, again.ARM64)
}

// compareARM64States fails t where b differs from a but in what
// armCounterGuest changes by running: x0, the PC, the virtual counter.
func compareARM64States(t *testing.T, a, b *ARM64State) {
	t.Helper()
	ran := map[uint64]bool{kvm.ARM64RegX(0): true, kvm.ARM64RegPC: true, kvm.ARM64RegCNTVCT: true} // vCPU 1's X0 and PC are 0 anyway
	for i := range a.VCPUs {
		ca, cb := &a.VCPUs[i], &b.VCPUs[i]
		if ca.MPState != cb.MPState {
			t.Errorf("vCPU %d: MP state %d after restore, was %d", i, cb.MPState, ca.MPState)
		}
		if len(ca.Regs) != len(cb.Regs) {
			t.Fatalf("vCPU %d: %d registers after restore, was %d", i, len(cb.Regs), len(ca.Regs))
		}
		for j, r := range ca.Regs {
			if cb.Regs[j].ID != r.ID || (!bytes.Equal(cb.Regs[j].Value, r.Value) && !ran[r.ID]) {
				t.Errorf("vCPU %d: register %#x is %x after restore, was %x", i, r.ID, cb.Regs[j].Value, r.Value)
			}
		}
		if !slices.Equal(ca.GICRedist, cb.GICRedist) || !slices.Equal(ca.GICCPU, cb.GICCPU) {
			t.Errorf("vCPU %d: redistributor %x and CPU interface %x after restore, were %x and %x", i, cb.GICRedist, cb.GICCPU, ca.GICRedist, ca.GICCPU)
		}
	}
	if a.VCPUs[1].MPState != mpStateStopped {
		t.Errorf("vCPU 1 saved in MP state %d, want powered off (%d)", a.VCPUs[1].MPState, mpStateStopped)
	}
	if !slices.Equal(a.GICDist, b.GICDist) || !slices.Equal(a.SPILevels, b.SPILevels) {
		t.Errorf("distributor %x levels %x after restore, were %x %x", b.GICDist, b.SPILevels, a.GICDist, a.SPILevels)
	}
}
