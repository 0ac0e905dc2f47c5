package vmm

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
	"golang.org/x/sys/unix"
)

// fakeKVM stands for an arm64 KVM's vCPUs and vGIC as saving and
// restoring see them, with the rules of Linux 6.1 this package relies
// on: identity registers take only the value they hold, the GIC's CPU
// interface has as many active-priority registers as its ICC_CTLR_EL1's
// PRIbits say and refuses more priority bits than the host's. Every
// write is logged, in order.
type fakeKVM struct {
	log   []string
	vcpus []*fakeVCPU
	gic   *fakeGIC
}

type fakeVCPU struct {
	k       *fakeKVM
	index   int
	ids     []uint64
	regs    map[uint64][]byte
	mp      kvm.MPState
	events  kvm.VCPUEvents
	refused map[uint64]bool // identity registers
}

type fakeGIC struct {
	k    *fakeKVM
	vals map[[2]uint64]uint64 // (group, attr) → value
	// hostCTLR is every CPU interface's ICC_CTLR_EL1 on a fresh GIC.
	hostCTLR uint64
}

// Register ids of the fake vCPU: a few of each kind KVM lists.
var (
	fakeMIDR    = kvm.ARM64SysReg(3, 0, 0, 0, 0)
	fakeSCTLR   = kvm.ARM64SysReg(3, 0, 1, 0, 0)
	fakeCTR     = kvm.ARM64SysReg(3, 3, 0, 0, 1)
	fakeCCSIDR0 = uint64(0x6000000000000000 | 0x0020000000000000 | 0x0011<<16) // KVM_REG_ARM_DEMUX
	fakeRegIDs  = []uint64{
		kvm.ARM64RegX(0), kvm.ARM64RegX(30), kvm.ARM64RegPC, kvm.ARM64RegPSTATE,
		kvm.ARM64RegV(0), kvm.ARM64RegV(31), kvm.ARM64RegFPSR, fakeCCSIDR0,
		fakeMIDR, kvm.ARM64RegMPIDR, fakeSCTLR, fakeCTR,
		kvm.ARM64RegCNTVCTL, kvm.ARM64RegCNTVCT, kvm.ARM64RegCNTVCVAL, kvm.ARM64RegPSCIVersion,
	}
)

// newFakeKVM is a fresh VM of cpus vCPUs whose CPU has midr, its GIC's
// CPU interfaces ctlr; secondaries powered off, as createVCPUs leaves
// them.
func newFakeKVM(cpus int, midr uint64, ctlr uint64) *fakeKVM {
	k := &fakeKVM{}
	k.gic = &fakeGIC{k: k, vals: map[[2]uint64]uint64{}, hostCTLR: ctlr}
	for i := range cpus {
		c := &fakeVCPU{k: k, index: i, ids: slices.Clone(fakeRegIDs), regs: map[uint64][]byte{}, refused: map[uint64]bool{}}
		for _, id := range c.ids {
			c.regs[id] = make([]byte, kvm.RegSize(id))
			if kvm.ARM64IdentityReg(id) {
				c.refused[id] = true
			}
		}
		binary.LittleEndian.PutUint64(c.regs[fakeMIDR], midr)
		binary.LittleEndian.PutUint64(c.regs[kvm.ARM64RegMPIDR], 1<<31|uint64(i))
		binary.LittleEndian.PutUint32(c.regs[fakeCCSIDR0], 0x700fe01a)
		if i > 0 {
			c.mp = kvm.MPStateStopped
		}
		k.vcpus = append(k.vcpus, c)
	}
	return k
}

func (k *fakeKVM) armVCPUs() []armVCPU {
	out := make([]armVCPU, len(k.vcpus))
	for i, c := range k.vcpus {
		out[i] = c
	}
	return out
}

func (c *fakeVCPU) RegList() ([]uint64, error) { return slices.Clone(c.ids), nil }

func (c *fakeVCPU) GetOneReg(id uint64) (uint64, error) {
	var buf [8]byte
	copy(buf[:], c.regs[id])
	return binary.LittleEndian.Uint64(buf[:]), nil
}

func (c *fakeVCPU) GetOneRegBytes(id uint64, buf []byte) error {
	v, ok := c.regs[id]
	if !ok || len(buf) != len(v) {
		return unix.ENOENT
	}
	copy(buf, v)
	return nil
}

func (c *fakeVCPU) SetOneRegBytes(id uint64, buf []byte) error {
	v, ok := c.regs[id]
	if !ok || len(buf) != len(v) {
		return unix.ENOENT
	}
	if c.refused[id] && !bytes.Equal(v, buf) {
		return unix.EINVAL
	}
	copy(v, buf)
	c.k.log = append(c.k.log, fmt.Sprintf("vcpu%d reg %#x", c.index, id))
	return nil
}

func (c *fakeVCPU) GetMPState() (kvm.MPState, error) { return c.mp, nil }
func (c *fakeVCPU) SetMPState(s kvm.MPState) error {
	c.mp = s
	c.k.log = append(c.k.log, fmt.Sprintf("vcpu%d mp", c.index))
	return nil
}
func (c *fakeVCPU) GetVCPUEvents() (kvm.VCPUEvents, error) { return c.events, nil }
func (c *fakeVCPU) SetVCPUEvents(e kvm.VCPUEvents) error {
	c.events = e
	c.k.log = append(c.k.log, fmt.Sprintf("vcpu%d events", c.index))
	return nil
}

// iccAttrCTLR is ICC_CTLR_EL1's attribute without its vCPU.
var iccAttrCTLR = iccCTLR.attr(0)

func (g *fakeGIC) GetAttr(group uint32, attr uint64) (uint64, error) {
	if group == kvm.VGICGroupCPUSysregs {
		ctlr := g.hostCTLR
		if v, ok := g.vals[[2]uint64{uint64(group), attr&^0xffff | iccAttrCTLR}]; ok {
			ctlr = v
		}
		if err := g.checkAPR(attr, ctlr); err != nil {
			return 0, err
		}
		if attr&0xffff == iccAttrCTLR {
			return ctlr, nil
		}
	}
	return g.vals[[2]uint64{uint64(group), attr}], nil
}

func (g *fakeGIC) SetAttr(group uint32, attr uint64, val *uint64) error {
	if group == kvm.VGICGroupCPUSysregs {
		ctlr := g.hostCTLR
		if v, ok := g.vals[[2]uint64{uint64(group), attr&^0xffff | iccAttrCTLR}]; ok {
			ctlr = v
		}
		if attr&0xffff == iccAttrCTLR && iccPriorityBits(*val) > iccPriorityBits(g.hostCTLR) {
			return unix.EINVAL
		}
		if err := g.checkAPR(attr, ctlr); err != nil {
			return err
		}
	}
	g.vals[[2]uint64{uint64(group), attr}] = *val
	g.k.log = append(g.k.log, fmt.Sprintf("gic %d %#x", group, attr))
	return nil
}

// checkAPR refuses an ICC_APnR beyond what ctlr's PRIbits give, as KVM.
func (g *fakeGIC) checkAPR(attr, ctlr uint64) error {
	enc := attr & 0xffff
	crm, op2 := enc>>3&0xf, enc&7
	idx := -1
	switch {
	case crm == 8 && op2 >= 4:
		idx = int(op2 - 4)
	case crm == 9 && op2 <= 3:
		idx = int(op2)
	}
	if enc>>7&0xf == 12 && idx >= iccAPRs(ctlr) {
		return unix.EINVAL
	}
	return nil
}

// fakeIRQs is the fake GIC's interrupt count, arm64.GICIRQs.
const fakeIRQs = 128

// A host GIC CPU interface: 5 priority bits, 16-bit INTIDs.
const fakeCTLR5 = 4 << 8

// runningFakeVM is a fake VM whose guest ran: registers, GIC and vCPU 1
// powered on, every value distinct.
func runningFakeVM(t *testing.T) *fakeKVM {
	t.Helper()
	k := newFakeKVM(2, 0x410fd083, fakeCTLR5)
	n := byte(1)
	for _, c := range k.vcpus {
		for _, id := range c.ids {
			if kvm.ARM64IdentityReg(id) {
				continue
			}
			for i := range c.regs[id] {
				c.regs[id][i] = n
				n++
			}
		}
		c.events.Raw[0] = 1
	}
	k.vcpus[1].mp = kvm.MPStateRunnable
	w := uint64(0x1000)
	set := func(group uint32, attr uint64) {
		k.gic.vals[[2]uint64{uint64(group), attr}] = w
		w++
	}
	config, state := gicDistLayout(fakeIRQs)
	for _, r := range append(config, state...) {
		for i := range r.words {
			set(kvm.VGICGroupDistRegs, kvm.VGICV3RegAttr(0, r.offset+uint32(4*i)))
		}
	}
	for _, c := range k.vcpus {
		mpidr, _ := c.GetOneReg(kvm.ARM64RegMPIDR)
		for _, r := range gicRedistLayout {
			for i := range r.words {
				set(kvm.VGICGroupRedistRegs, kvm.VGICV3RegAttr(mpidr, r.offset+uint32(4*i)))
			}
		}
		for _, r := range iccLayout(fakeCTLR5)[2:] {
			set(kvm.VGICGroupCPUSysregs, r.attr(mpidr))
		}
		k.gic.vals[[2]uint64{kvm.VGICGroupCPUSysregs, iccCTLR.attr(mpidr)}] = fakeCTLR5 | 1<<1 // EOImode
		k.gic.vals[[2]uint64{kvm.VGICGroupCPUSysregs, iccSRE.attr(mpidr)}] = 7
	}
	for intid := uint32(32); intid < fakeIRQs; intid += 32 {
		set(kvm.VGICGroupLevelInfo, kvm.VGICV3LevelInfoAttr(0, intid))
	}
	return k
}

// savedThroughGob saves k with a GICv3 and passes the State through gob,
// as a snapshot file does.
func savedThroughGob(t *testing.T, k *fakeKVM) *State {
	t.Helper()
	return savedKindThroughGob(t, k, arm64.GICv3)
}

// savedKindThroughGob is savedThroughGob with a GIC of kind.
func savedKindThroughGob(t *testing.T, k *fakeKVM, kind arm64.GIC) *State {
	t.Helper()
	s, err := saveARM64(k.armVCPUs(), k.gic, kind, fakeIRQs)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(&State{ARM64: s}); err != nil {
		t.Fatal(err)
	}
	var back State
	if err := gob.NewDecoder(&buf).Decode(&back); err != nil {
		t.Fatal(err)
	}
	return &back
}

func TestARM64StateRoundTripsThroughGob(t *testing.T) {
	src := runningFakeVM(t)
	s := savedThroughGob(t, src)
	if len(s.VCPUs) != 0 || s.ARM64 == nil {
		t.Fatalf("an arm64 state with %d x86 vCPUs and ARM64 %v", len(s.VCPUs), s.ARM64)
	}
	if got := len(s.ARM64.VCPUs[0].GICCPU); got != 9 {
		t.Errorf("%d CPU interface registers saved for 5 priority bits, want 9 (one AP0R and one AP1R)", got)
	}
	dst := newFakeKVM(2, 0x410fd083, fakeCTLR5)
	if err := restoreARM64(dst.armVCPUs(), dst.gic, arm64.GICv3, fakeIRQs, s.ARM64); err != nil {
		t.Fatal(err)
	}
	for i, c := range dst.vcpus {
		want := src.vcpus[i]
		for _, id := range c.ids {
			if !bytes.Equal(c.regs[id], want.regs[id]) {
				t.Errorf("vCPU %d register %#x is %x after restore, want %x", i, id, c.regs[id], want.regs[id])
			}
		}
		if c.mp != want.mp || c.events != want.events {
			t.Errorf("vCPU %d MP state %d events %x, want %d %x", i, c.mp, c.events.Raw[:1], want.mp, want.events.Raw[:1])
		}
	}
	if !maps.Equal(dst.gic.vals, src.gic.vals) {
		for k, v := range src.gic.vals {
			if dst.gic.vals[k] != v {
				t.Errorf("GIC group %d attr %#x is %#x after restore, want %#x", k[0], k[1], dst.gic.vals[k], v)
			}
		}
		t.Errorf("the GIC has %d attributes set after restore, the saved one %d", len(dst.gic.vals), len(src.gic.vals))
	}
}

// logIndex is the position of the first (or, last, the last) log entry
// with prefix, -1 if none.
func logIndex(log []string, prefix string, last bool) int {
	at := -1
	for i, e := range log {
		if strings.HasPrefix(e, prefix) {
			at = i
			if !last {
				break
			}
		}
	}
	return at
}

func TestARM64RestoreOrder(t *testing.T) {
	s := savedThroughGob(t, runningFakeVM(t))
	k := newFakeKVM(2, 0x410fd083, fakeCTLR5)
	if err := restoreARM64(k.armVCPUs(), k.gic, arm64.GICv3, fakeIRQs, s.ARM64); err != nil {
		t.Fatal(err)
	}
	dist := func(off uint32) string {
		return fmt.Sprintf("gic %d %#x", kvm.VGICGroupDistRegs, kvm.VGICV3RegAttr(0, off))
	}
	redist := func(vcpu uint64, off uint32) string {
		return fmt.Sprintf("gic %d %#x", kvm.VGICGroupRedistRegs, kvm.VGICV3RegAttr(1<<31|vcpu, off))
	}
	icc := func(vcpu uint64, r iccReg) string {
		return fmt.Sprintf("gic %d %#x", kvm.VGICGroupCPUSysregs, r.attr(1<<31|vcpu))
	}
	level := fmt.Sprintf("gic %d ", kvm.VGICGroupLevelInfo)
	ap0 := iccLayout(fakeCTLR5)[5]
	for _, o := range []struct{ before, after string }{
		{"vcpu1 reg", "gic "},          // the vCPUs' registers before the GIC
		{"vcpu0 reg", "vcpu0 mp"},      // a vCPU's registers before its MP state
		{dist(gicdICFGR + 8), level},   // an SPI's trigger before its level
		{level, dist(gicdISPENDR + 4)}, // its level before its pending latch
		{redist(1, gicrIPRIORITYR), redist(1, gicrCTLR)},
		{redist(0, gicrISPENDR0), redist(0, gicrCTLR)},
		{icc(0, iccSRE), icc(0, iccCTLR)},
		{icc(1, iccCTLR), icc(1, ap0)}, // PRIbits before the APnRs
		{icc(1, ap0), dist(gicdCTLR)},  // GICD_CTLR last
		{dist(gicdISACTIVER + 12), dist(gicdCTLR)},
	} {
		last, first := logIndex(k.log, o.before, true), logIndex(k.log, o.after, false)
		if last < 0 || first < 0 || last >= first {
			t.Errorf("restore wrote %q (last at %d) and %q (first at %d), want all of the first before the second", o.before, last, o.after, first)
		}
	}
	if first := logIndex(k.log, "gic ", false); k.log[first] != dist(gicdIIDR) {
		t.Errorf("the first GIC write is %q, want GICD_IIDR", k.log[first])
	}
	if lastReg, firstGIC := logIndex(k.log, "vcpu", true), logIndex(k.log, "gic ", false); lastReg > firstGIC {
		t.Errorf("a vCPU write at %d after the first GIC write at %d", lastReg, firstGIC)
	}
	if k.log[len(k.log)-1] != dist(gicdCTLR) {
		t.Errorf("the last write is %q, want GICD_CTLR", k.log[len(k.log)-1])
	}
}

func TestARM64RestoreRefusesMalformedState(t *testing.T) {
	for name, spoil := range map[string]func(s *ARM64State){
		"no arm64 part":      nil,
		"a vCPU missing":     func(s *ARM64State) { s.VCPUs = s.VCPUs[:1] },
		"a distributor word": func(s *ARM64State) { s.GICDist = append(s.GICDist, 0) },
		"SPI levels short":   func(s *ARM64State) { s.SPILevels = s.SPILevels[:1] },
		"a short register":   func(s *ARM64State) { s.VCPUs[1].Regs[4].Value = s.VCPUs[1].Regs[4].Value[:8] },
		"a register twice":   func(s *ARM64State) { s.VCPUs[0].Regs[1].ID = s.VCPUs[0].Regs[0].ID },
		"no registers":       func(s *ARM64State) { s.VCPUs[0].Regs = nil },
		"too many registers": func(s *ARM64State) { s.VCPUs[0].Regs = make([]ARM64Reg, kvm.MaxRegListLength+1) },
		"an MP state":        func(s *ARM64State) { s.VCPUs[1].MPState = 3 },
		"a redistributor":    func(s *ARM64State) { s.VCPUs[0].GICRedist = s.VCPUs[0].GICRedist[1:] },
		"ICC count":          func(s *ARM64State) { s.VCPUs[0].GICCPU[1] |= 6 << 8 }, // 7 bits: 4 APnR each
		"ICC empty":          func(s *ARM64State) { s.VCPUs[0].GICCPU = nil },
		"GIC size":           func(s *ARM64State) { s.GICIRQs = 64 },
	} {
		t.Run(name, func(t *testing.T) {
			s := savedThroughGob(t, runningFakeVM(t)).ARM64
			if spoil == nil {
				s = nil
			} else {
				spoil(s)
			}
			k := newFakeKVM(2, 0x410fd083, fakeCTLR5)
			err := restoreARM64(k.armVCPUs(), k.gic, arm64.GICv3, fakeIRQs, s)
			if err == nil {
				t.Fatal("restored")
			}
			if len(k.log) != 0 {
				t.Errorf("error %v after %d writes to KVM (first %q), want none", err, len(k.log), k.log[0])
			}
			t.Log(err)
		})
	}
}

func TestARM64RestoreOfAnotherHostIsAMismatch(t *testing.T) {
	for name, fresh := range map[string]func() *fakeKVM{
		"another CPU": func() *fakeKVM { return newFakeKVM(2, 0x410fd0c0, fakeCTLR5) },
		"other registers": func() *fakeKVM {
			k := newFakeKVM(2, 0x410fd083, fakeCTLR5)
			k.vcpus[1].ids = k.vcpus[1].ids[:len(k.vcpus[1].ids)-1]
			return k
		},
		"fewer priority bits": func() *fakeKVM { return newFakeKVM(2, 0x410fd083, 3<<8) },
	} {
		t.Run(name, func(t *testing.T) {
			s := savedThroughGob(t, runningFakeVM(t)).ARM64
			k := fresh()
			err := restoreARM64(k.armVCPUs(), k.gic, arm64.GICv3, fakeIRQs, s)
			if !errors.Is(err, snapshot.ErrMismatch) {
				t.Fatalf("restore: %v, want snapshot.ErrMismatch", err)
			}
			if len(k.log) > 0 {
				t.Errorf("%d writes before the mismatch was found: %q", len(k.log), k.log)
			}
			t.Log(err)
		})
	}
}

func TestICCLayoutFollowsPriorityBits(t *testing.T) {
	for bits, apr := range map[uint64]int{5: 1, 6: 2, 7: 4} {
		layout := iccLayout((bits - 1) << 8)
		if len(layout) != 7+2*apr {
			t.Errorf("%d priority bits: %d registers, want %d", bits, len(layout), 7+2*apr)
		}
		if layout[0] != iccSRE || layout[1] != iccCTLR || layout[len(layout)-1].name != "ICC_IGRPEN1_EL1" {
			t.Errorf("%d priority bits: order %v", bits, layout)
		}
	}
	if a := iccLayout(6 << 8)[8]; a.name != "ICC_AP0R3_EL1" || a.attr(0) != 3<<14|12<<7|8<<3|7 {
		t.Errorf("the fourth AP0R is %s %#x", a.name, a.attr(0))
	}
}

func TestGICDistLayoutCoversTheSPIs(t *testing.T) {
	config, state := gicDistLayout(128)
	at := map[string]gicRange{}
	for _, r := range append(config, state...) {
		at[r.name] = r
	}
	for name, want := range map[string]gicRange{
		"GICD_IGROUPR":    {"GICD_IGROUPR", 0x84, 3},
		"GICD_ICFGR":      {"GICD_ICFGR", 0xC08, 6},
		"GICD_IPRIORITYR": {"GICD_IPRIORITYR", 0x420, 24},
		"GICD_IROUTER":    {"GICD_IROUTER", 0x6100, 192},
		"GICD_ISPENDR":    {"GICD_ISPENDR", 0x204, 3},
		"GICD_CTLR":       {"GICD_CTLR", 0, 1},
	} {
		if at[name] != want {
			t.Errorf("%s: %+v, want %+v", name, at[name], want)
		}
	}
	if n := gicWords(config, state); n != 236 {
		t.Errorf("%d distributor words for 128 interrupts, want 236", n)
	}
	if state[len(state)-1].name != "GICD_CTLR" || config[0].name != "GICD_IIDR" {
		t.Errorf("GICD_IIDR must come first and GICD_CTLR last: %v ... %v", config[0], state[len(state)-1])
	}
}
