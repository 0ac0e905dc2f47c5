package vmm

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// counterAddr is an MMIO address free in vmm/arm64's layout, where the
// counting guests store their counts: vCPU 0 at counterAddr, vCPU 1 at
// counterAddr + 0x1000.
const counterAddr = 0x1000_0000

// armCounterLoop counts in x0 forever, storing each count to x1 (an MMIO
// exit each).
var armCounterLoop = []uint32{
	0xd2800000, // movz x0, #0
	0x91000400, // loop: add x0, x0, #1
	0xf9000020, // str x0, [x1]
	0x17fffffe, // b loop
}

// armSecondaryEntry is where armCPUOnGuest starts vCPU 1.
const armSecondaryEntry = arm64.RAMBase + 0x100

// armCounterGuest is vCPU 0's code, counting to counterAddr; with cpuOn
// it first starts vCPU 1 (PSCI CPU_ON) at armSecondaryEntry, where
// armSecondaryGuest counts to counterAddr + 0x1000.
func armCounterGuest(cpuOn bool) []uint32 {
	var code []uint32
	if cpuOn {
		code = []uint32{
			0xd2800060, // movz x0, #0x0003
			0xf2b88000, // movk x0, #0xc400, lsl #16: PSCI 0.2 CPU_ON (64-bit)
			0xd2800021, // movz x1, #1: target MPIDR
			0xd2802002, // movz x2, #0x100
			0xf2b00002, // movk x2, #0x8000, lsl #16: entry armSecondaryEntry
			0xd2800003, // movz x3, #0: context
			0xd4000002, // hvc #0
		}
	}
	code = append(code, 0xd2a20001) // movz x1, #0x1000, lsl #16: counterAddr
	return append(code, armCounterLoop...)
}

var armSecondaryGuest = append([]uint32{
	0xd2a20001, // movz x1, #0x1000, lsl #16
	0xf2820001, // movk x1, #0x1000: counterAddr + 0x1000
}, armCounterLoop...)

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

// newCounterVM is a VM of 2 vCPUs with a counter device for each, vCPU 1
// powered off as createVCPUs leaves it.
func newCounterVM(t *testing.T) (*VM, [2]*counterDevice) {
	t.Helper()
	nested.RequireKVM(t)
	vm, err := New(Config{MemoryBytes: 16 << 20, CPUs: 2, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	devs := [2]*counterDevice{{}, {}}
	for i, d := range devs {
		if err := vm.MMIO().Register(counterAddr+uint64(i)*0x1000, 8, d); err != nil {
			vm.Close()
			t.Fatal(err)
		}
	}
	return vm, devs
}

// loadWords writes code to guest memory at gpa.
func loadWords(t *testing.T, vm *VM, gpa uint64, code []uint32) {
	t.Helper()
	b := make([]byte, 4*len(code))
	for i, w := range code {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
	if err := vm.Memory().WriteAt(b, gpa); err != nil {
		t.Fatal(err)
	}
}

// An arm64 VM paused mid-count, saved (through gob, as a snapshot holds
// it) and restored into a fresh VM with its memory, goes on from the next
// count on each vCPU that ran; a powered-off secondary stays off, a
// started one counts on; and saving the restored VM gives back every
// register and GIC word it was given, but for the counts, the PCs and
// the virtual counter, which ran on: KVM took each one back.
func TestKVMARM64SaveAndRestoreState(t *testing.T) {
	for _, cpuOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("secondary started %v", cpuOn), func(t *testing.T) { saveAndRestoreCounter(t, cpuOn) })
	}
}

func saveAndRestoreCounter(t *testing.T, cpuOn bool) {
	vm, devs := newCounterVM(t)
	defer vm.Close()
	loadWords(t, vm, arm64.RAMBase, armCounterGuest(cpuOn))
	loadWords(t, vm, armSecondaryEntry, armSecondaryGuest)
	if err := vm.SetBootEntry(0, arm64.RAMBase, 0); err != nil {
		t.Fatal(err)
	}
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	ran := 1
	if cpuOn {
		ran = 2
	}
	for _, d := range devs[:ran] {
		d.waitCount(t, 3)
	}
	saved, last := pauseAndSave(t, vm, devs[:ran])
	image := make([]byte, 0x1000)
	if err := vm.Memory().ReadAt(image, arm64.RAMBase); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Stop(); err != nil {
		t.Fatal(err)
	}
	if want := map[bool]uint32{false: uint32(kvm.MPStateStopped), true: uint32(kvm.MPStateRunnable)}[cpuOn]; saved.ARM64.VCPUs[1].MPState != want {
		t.Errorf("vCPU 1 saved in MP state %d, want %d", saved.ARM64.VCPUs[1].MPState, want)
	}

	restored, devs2 := newCounterVM(t)
	defer restored.Close()
	if err := restored.Memory().WriteAt(image, arm64.RAMBase); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := restored.RestoreState(saved); err != nil {
		t.Fatal(err)
	}
	t.Logf("RestoreState took %v", time.Since(began))
	if err := restored.Start(); err != nil {
		t.Fatal(err)
	}
	for i, d := range devs2[:ran] {
		if first := d.waitCount(t, 1)[0]; first != last[i]+1 {
			t.Errorf("the restored vCPU %d first stored %d, want %d", i, first, last[i]+1)
		}
	}
	again, _ := pauseAndSave(t, restored, nil)
	if n := len(devs2[1].waitCount(t, 0)); !cpuOn && n > 0 {
		t.Errorf("the powered-off vCPU 1 stored %d counts after restore", n)
	}
	compareARM64States(t, saved.ARM64, again.ARM64)
}

// pauseAndSave pauses vm and saves its state, passed through gob as a
// snapshot holds it; last are the last counts of devs.
func pauseAndSave(t *testing.T, vm *VM, devs []*counterDevice) (*State, []uint64) {
	t.Helper()
	if err := vm.Pause(); err != nil {
		t.Fatal(err)
	}
	saved, err := vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	var last []uint64
	for _, d := range devs {
		counts := d.waitCount(t, 0)
		last = append(last, counts[len(counts)-1])
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
	return &state, last
}

// compareARM64States fails t where b differs from a but in what
// armCounterGuest changes by running: x0, the PC, the virtual counter.
func compareARM64States(t *testing.T, a, b *ARM64State) {
	t.Helper()
	ran := map[uint64]bool{kvm.ARM64RegX(0): true, kvm.ARM64RegPC: true, kvm.ARM64RegCNTVCT: true}
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
	if !slices.Equal(a.GICDist, b.GICDist) || !slices.Equal(a.SPILevels, b.SPILevels) {
		t.Errorf("distributor %x levels %x after restore, were %x %x", b.GICDist, b.SPILevels, a.GICDist, a.SPILevels)
	}
}
