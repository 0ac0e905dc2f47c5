package vmm

import (
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// runningFakeGICv2VM is runningFakeVM with a GICv2: every shared and
// banked distributor register and every CPU interface register distinct.
func runningFakeGICv2VM(t *testing.T) *fakeKVM {
	t.Helper()
	k := runningFakeVM(t)
	k.gic.vals = map[[2]uint64]uint64{}
	w := uint64(0x2000)
	set := func(group uint32, cpu int, ranges ...[]gicRange) {
		for _, rs := range ranges {
			for _, r := range rs {
				for i := range r.words {
					k.gic.vals[[2]uint64{uint64(group), kvm.VGICV2RegAttr(cpu, r.offset+uint32(4*i))}] = w
					w++
				}
			}
		}
	}
	set(kvm.VGICGroupDistRegs, 0, gicV2DistLayoutRanges(fakeIRQs)...)
	for i := range k.vcpus {
		set(kvm.VGICGroupDistRegs, i, gicV2BankedLayout)
		set(kvm.VGICGroupCPURegs, i, gicV2CPULayout)
	}
	return k
}

func gicV2DistLayoutRanges(irqs uint32) [][]gicRange {
	config, state := gicV2DistLayout(irqs)
	return [][]gicRange{config, state}
}

// savedGICv2ThroughGob saves k as a GICv2 VM through gob, as a snapshot
// file holds it.
func savedGICv2ThroughGob(t *testing.T, k *fakeKVM) *ARM64State {
	t.Helper()
	return savedKindThroughGob(t, k, arm64.GICv2).ARM64
}

func TestARM64GICv2StateRoundTrips(t *testing.T) {
	src := runningFakeGICv2VM(t)
	s := savedGICv2ThroughGob(t, src)
	if !s.GICv2 || len(s.SPILevels) != 0 {
		t.Fatalf("a GICv2 state marked GICv2=%v with %d SPI level words", s.GICv2, len(s.SPILevels))
	}
	dst := newFakeKVM(2, 0x410fd083, fakeCTLR5)
	if err := restoreARM64(dst.armVCPUs(), dst.gic, arm64.GICv2, fakeIRQs, s); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(dst.gic.vals, src.gic.vals) {
		for k, v := range src.gic.vals {
			if dst.gic.vals[k] != v {
				t.Errorf("GIC group %d attr %#x is %#x after restore, want %#x", k[0], k[1], dst.gic.vals[k], v)
			}
		}
		t.Errorf("the GIC has %d attributes set after restore, the saved one %d", len(dst.gic.vals), len(src.gic.vals))
	}
	for i, c := range dst.vcpus {
		if c.mp != src.vcpus[i].mp {
			t.Errorf("vCPU %d MP state %d, want %d", i, c.mp, src.vcpus[i].mp)
		}
	}
}

// TestARM64GICv2RestoreOrder: the distributor's IIDR first, the banks
// before the shared enable bits, each CPU interface's GICC_CTLR after its
// other registers, GICD_CTLR last of all.
func TestARM64GICv2RestoreOrder(t *testing.T) {
	s := savedGICv2ThroughGob(t, runningFakeGICv2VM(t))
	k := newFakeKVM(2, 0x410fd083, fakeCTLR5)
	if err := restoreARM64(k.armVCPUs(), k.gic, arm64.GICv2, fakeIRQs, s); err != nil {
		t.Fatal(err)
	}
	entry := func(group uint32, cpu int, off uint32) string {
		return fmt.Sprintf("gic %d %#x", group, kvm.VGICV2RegAttr(cpu, off))
	}
	var gicLog []string
	for _, l := range k.log {
		if len(l) > 4 && l[:4] == "gic " {
			gicLog = append(gicLog, l)
		}
	}
	if gicLog[0] != entry(kvm.VGICGroupDistRegs, 0, gicdIIDR) {
		t.Errorf("first GIC write %q, want GICD_IIDR", gicLog[0])
	}
	if last := gicLog[len(gicLog)-1]; last != entry(kvm.VGICGroupDistRegs, 0, gicdCTLR) {
		t.Errorf("last GIC write %q, want GICD_CTLR", last)
	}
	bank1 := logIndex(gicLog, entry(kvm.VGICGroupDistRegs, 1, gicdISENABLER), false)
	sharedEnable := logIndex(gicLog, entry(kvm.VGICGroupDistRegs, 0, gicdISENABLER+4), false)
	if bank1 < 0 || sharedEnable < 0 || bank1 > sharedEnable {
		t.Errorf("vCPU 1's bank at %d, the shared enable bits at %d: want the banks first", bank1, sharedEnable)
	}
	for cpu := range 2 {
		pmr := logIndex(gicLog, entry(kvm.VGICGroupCPURegs, cpu, gicv2cPMR), false)
		ctlr := logIndex(gicLog, entry(kvm.VGICGroupCPURegs, cpu, gicv2cCTLR), false)
		if pmr < 0 || ctlr < pmr {
			t.Errorf("vCPU %d: GICC_PMR at %d, GICC_CTLR at %d: want GICC_CTLR after", cpu, pmr, ctlr)
		}
	}
}

// TestARM64GICStateOfTheOtherKindIsAMismatch: a GICv3 VM's state on a
// GICv2 VM (another host) and the reverse boot afresh, before any write.
func TestARM64GICStateOfTheOtherKindIsAMismatch(t *testing.T) {
	v2 := savedGICv2ThroughGob(t, runningFakeGICv2VM(t))
	v3 := savedThroughGob(t, runningFakeVM(t)).ARM64
	for name, tc := range map[string]struct {
		s    *ARM64State
		kind arm64.GIC
	}{"GICv3 state on a GICv2": {v3, arm64.GICv2}, "GICv2 state on a GICv3": {v2, arm64.GICv3}} {
		k := newFakeKVM(2, 0x410fd083, fakeCTLR5)
		err := restoreARM64(k.armVCPUs(), k.gic, tc.kind, fakeIRQs, tc.s)
		if !errors.Is(err, snapshot.ErrMismatch) {
			t.Errorf("%s: %v, want a mismatch", name, err)
		}
		if len(k.log) != 0 {
			t.Errorf("%s: %d writes before the refusal", name, len(k.log))
		}
	}
}

// TestARM64GICv2RestoreRefusesMalformedState: wrong word counts and a CPU
// interface value wider than its 32-bit register are refused unwritten.
func TestARM64GICv2RestoreRefusesMalformedState(t *testing.T) {
	for name, damage := range map[string]func(s *ARM64State){
		"short distributor":     func(s *ARM64State) { s.GICDist = s.GICDist[1:] },
		"short bank":            func(s *ARM64State) { s.VCPUs[1].GICRedist = s.VCPUs[1].GICRedist[:3] },
		"long CPU interface":    func(s *ARM64State) { s.VCPUs[0].GICCPU = append(s.VCPUs[0].GICCPU, 0) },
		"wide CPU register":     func(s *ARM64State) { s.VCPUs[0].GICCPU[0] = 1 << 40 },
		"SPI levels on a GICv2": func(s *ARM64State) { s.SPILevels = []uint32{1, 2, 3} },
	} {
		s := savedGICv2ThroughGob(t, runningFakeGICv2VM(t))
		damage(s)
		k := newFakeKVM(2, 0x410fd083, fakeCTLR5)
		err := restoreARM64(k.armVCPUs(), k.gic, arm64.GICv2, fakeIRQs, s)
		if err == nil || errors.Is(err, snapshot.ErrMismatch) {
			t.Errorf("%s: %v, want damage refused", name, err)
		}
		if len(k.log) != 0 {
			t.Errorf("%s: %d writes before the refusal", name, len(k.log))
		}
	}
}
