package vmm

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// ARM64State is State's part on arm64 (nil on x86): what KVM holds of a
// paused arm64 VM. Each vCPU's registers, as KVM_GET_REG_LIST lists them
// (core and FP/SIMD registers, system registers, the virtual timer,
// firmware pseudo-registers), its run state and pending SError, and the
// in-kernel GICv3: distributor, the redistributor and CPU interface of
// each vCPU, the SPIs' line levels. The registers are 32-bit words (the
// distributor's and redistributors') or 64-bit values (the CPU
// interface's) in the fixed orders gicDistLayout, gicRedistLayout and
// iccLayout give, which are also the orders they are restored in.
//
// The file it comes from is trusted less than memory: RestoreState checks
// every count and size against this VM before it touches KVM.
type ARM64State struct {
	VCPUs []ARM64VCPUState
	// GICIRQs is the GIC's interrupt count (32 private + the SPIs).
	GICIRQs uint32
	// GICDist are the distributor's registers, gicDistLayout(GICIRQs).
	GICDist []uint32
	// SPILevels are the SPIs' input line levels, a bit per SPI, 32 to a
	// word, from INTID 32 upward.
	SPILevels []uint32
	// GICv2 marks a VM whose GIC is a GICv2 (armgicv2.go): GICDist then
	// holds gicV2DistLayout's words, each vCPU's GICRedist its banked
	// distributor registers (gicV2BankedLayout) and GICCPU its GICC_*
	// registers (gicV2CPULayout); SPILevels is empty, since a GICv2 has
	// no line-level attribute and every device interrupt here is
	// edge-triggered.
	GICv2 bool
}

// ARM64VCPUState is one arm64 vCPU's part of ARM64State.
type ARM64VCPUState struct {
	// Regs are every register KVM_GET_REG_LIST listed, in its order.
	Regs    []ARM64Reg
	MPState uint32
	// Events are the pending SError and external abort (KVM_GET_VCPU_EVENTS).
	Events kvm.VCPUEvents
	// GICRedist are the vCPU's redistributor registers, gicRedistLayout.
	GICRedist []uint32
	// GICCPU are the vCPU's GIC CPU interface registers (ICC_*),
	// iccLayout of the ICC_CTLR_EL1 among them.
	GICCPU []uint64
}

// ARM64Reg is one register: its KVM id and its value, KVM_REG_SIZE(ID)
// bytes in the kernel's (little-endian) order.
type ARM64Reg struct {
	ID    uint64
	Value []byte
}

// GIC bounds.
const (
	// maxGICIRQs is the GICv3 architecture's SPI ceiling (INTID 1020).
	maxGICIRQs = 1024
	// gicPrivateIRQs are the SGIs and PPIs, banked per vCPU.
	gicPrivateIRQs = 32
)

// gicRange is a run of 32-bit GIC registers: words of them from offset in
// the distributor's or a redistributor's frame.
type gicRange struct {
	name   string
	offset uint32
	words  int
}

// Distributor register offsets (GICv3 architecture specification; a
// GICv2's are the same, and it has GICD_ITARGETSR where a GICv3 in
// affinity routing reserves the space).
const (
	gicdCTLR       = 0x0000
	gicdIIDR       = 0x0008
	gicdIGROUPR    = 0x0080
	gicdISENABLER  = 0x0100
	gicdISPENDR    = 0x0200
	gicdISACTIVER  = 0x0300
	gicdIPRIORITYR = 0x0400
	gicdITARGETSR  = 0x0800
	gicdICFGR      = 0x0C00
	gicdIROUTER    = 0x6000
)

// gicDistLayout lists the distributor registers a snapshot holds for a
// GIC of irqs interrupts, in restore order, split where the SPIs' line
// levels go (config before them, state after). The per-interrupt
// registers start at the SPIs: the private interrupts' are RAZ/WI in the
// distributor (the redistributors hold them).
//
// GICD_IIDR comes first, as KVM's documentation asks (its revision picks
// the behaviour the rest is restored under). Then the configuration: a
// level-triggered SPI's pending state depends on its line level, set
// after ICFGR and before ISPENDR, as qemu does. The enable, pending and
// active bits only set (uaccess writes of the set registers, on a GIC
// where all are clear). GICD_CTLR, which turns the groups on, is last.
func gicDistLayout(irqs uint32) (config, state []gicRange) {
	spis := int(irqs) - gicPrivateIRQs
	return spiDistLayout(irqs, gicRange{"GICD_IROUTER", gicdIROUTER + gicPrivateIRQs*8, spis * 2})
}

// spiDistLayout is a distributor layout (gicDistLayout's order) whose
// SPIs are routed by the registers routing names: a GICv3's IROUTER, a
// GICv2's ITARGETSR.
func spiDistLayout(irqs uint32, routing gicRange) (config, state []gicRange) {
	spis := int(irqs) - gicPrivateIRQs
	bitmap := func(name string, base uint32) gicRange {
		return gicRange{name, base + gicPrivateIRQs/8, spis / 32}
	}
	config = []gicRange{
		{"GICD_IIDR", gicdIIDR, 1},
		bitmap("GICD_IGROUPR", gicdIGROUPR),
		{"GICD_ICFGR", gicdICFGR + gicPrivateIRQs*2/8, spis * 2 / 32},
		{"GICD_IPRIORITYR", gicdIPRIORITYR + gicPrivateIRQs, spis / 4},
		routing,
	}
	state = []gicRange{
		bitmap("GICD_ISENABLER", gicdISENABLER),
		bitmap("GICD_ISPENDR", gicdISPENDR),
		bitmap("GICD_ISACTIVER", gicdISACTIVER),
		{"GICD_CTLR", gicdCTLR, 1},
	}
	return config, state
}

// Redistributor register offsets: the RD frame, then the SGI frame 64 KiB
// above it.
const (
	gicrCTLR       = 0x0000
	gicrSGIFrame   = 0x10000
	gicrIGROUPR0   = gicrSGIFrame + 0x0080
	gicrISENABLER0 = gicrSGIFrame + 0x0100
	gicrISPENDR0   = gicrSGIFrame + 0x0200
	gicrISACTIVER0 = gicrSGIFrame + 0x0300
	gicrIPRIORITYR = gicrSGIFrame + 0x0400
	gicrICFGR0     = gicrSGIFrame + 0x0C00
)

// gicRedistLayout lists a redistributor's registers, in restore order:
// the SGIs' and PPIs' configuration, then their enable, pending and
// active bits, GICR_CTLR last. GICR_PROPBASER and GICR_PENDBASER are left
// out: they locate LPI tables, and without an ITS (this VMM creates
// none) KVM offers no LPIs (GICR_TYPER.PLPIS clear, EnableLPIs ignored);
// and KVM sanitises what is written to them, so writing back the reset
// value would not even restore it (0 reads back 0x180).
var gicRedistLayout = []gicRange{
	{"GICR_IGROUPR0", gicrIGROUPR0, 1},
	{"GICR_ICFGR0", gicrICFGR0, 2},
	{"GICR_IPRIORITYR", gicrIPRIORITYR, 8},
	{"GICR_ISENABLER0", gicrISENABLER0, 1},
	{"GICR_ISPENDR0", gicrISPENDR0, 1},
	{"GICR_ISACTIVER0", gicrISACTIVER0, 1},
	{"GICR_CTLR", gicrCTLR, 1},
}

// gicWords is the number of words ranges cover.
func gicWords(ranges ...[]gicRange) int {
	n := 0
	for _, rs := range ranges {
		for _, r := range rs {
			n += r.words
		}
	}
	return n
}

// iccReg is a GIC CPU interface system register by its encoding.
type iccReg struct {
	name                    string
	op0, op1, crn, crm, op2 uint64
}

func (r iccReg) attr(mpidr uint64) uint64 {
	return kvm.VGICV3SysregAttr(mpidr, r.op0, r.op1, r.crn, r.crm, r.op2)
}

var (
	iccSRE  = iccReg{"ICC_SRE_EL1", 3, 0, 12, 12, 5}
	iccCTLR = iccReg{"ICC_CTLR_EL1", 3, 0, 12, 12, 4}
)

// iccLayout lists the CPU interface registers of a vCPU whose
// ICC_CTLR_EL1 is ctlr, in restore order: ICC_SRE_EL1, then ICC_CTLR_EL1
// (its PRIbits say how many active-priority registers the rest has, and
// KVM refuses an APnR beyond them), priority mask and binary points, the
// active priorities, the group enables last.
func iccLayout(ctlr uint64) []iccReg {
	regs := []iccReg{
		iccSRE, iccCTLR,
		{"ICC_PMR_EL1", 3, 0, 4, 6, 0},
		{"ICC_BPR0_EL1", 3, 0, 12, 8, 3},
		{"ICC_BPR1_EL1", 3, 0, 12, 12, 3},
	}
	n := iccAPRs(ctlr)
	for i := range n {
		regs = append(regs, iccReg{fmt.Sprintf("ICC_AP0R%d_EL1", i), 3, 0, 12, 8, 4 + uint64(i)})
	}
	for i := range n {
		regs = append(regs, iccReg{fmt.Sprintf("ICC_AP1R%d_EL1", i), 3, 0, 12, 9, uint64(i)})
	}
	return append(regs,
		iccReg{"ICC_IGRPEN0_EL1", 3, 0, 12, 12, 6},
		iccReg{"ICC_IGRPEN1_EL1", 3, 0, 12, 12, 7})
}

// iccAPRs is the number of ICC_AP0Rn (and AP1Rn) registers a CPU
// interface has: one for 5 priority bits, two for 6, four for 7
// (ICC_CTLR_EL1.PRIbits holds the count minus one).
func iccAPRs(ctlr uint64) int {
	switch iccPriorityBits(ctlr) {
	case 7, 8:
		return 4
	case 6:
		return 2
	default:
		return 1
	}
}

func iccPriorityBits(ctlr uint64) int { return int(ctlr>>8&7) + 1 }

// validate checks s's shape against a VM of vcpus vCPUs whose GIC has irqs
// interrupts, before any of it reaches KVM: counts, sizes and the
// values KVM takes as enumerations. A snapshot of another shape wraps
// snapshot.ErrMismatch; a malformed one is plain damage.
func (s *ARM64State) validate(vcpus int, kind arm64.GIC, irqs uint32) error {
	if s == nil {
		return fmt.Errorf("vmm: the state holds no arm64 VM (a snapshot of another architecture): %w", snapshot.ErrMismatch)
	}
	if len(s.VCPUs) != vcpus {
		return fmt.Errorf("vmm: the state has %d vCPUs, this VM %d", len(s.VCPUs), vcpus)
	}
	if s.GICv2 != (kind == arm64.GICv2) {
		return fmt.Errorf("vmm: the state is of a VM with another GIC than this VM's %v: %w", kind, snapshot.ErrMismatch)
	}
	if s.GICIRQs != irqs {
		return fmt.Errorf("vmm: the state's GIC has %d interrupts, this VM's %d: %w", s.GICIRQs, irqs, snapshot.ErrMismatch)
	}
	if irqs <= gicPrivateIRQs || irqs > maxGICIRQs || irqs%32 != 0 {
		return fmt.Errorf("vmm: a GIC of %d interrupts", irqs)
	}
	distWords, levelWords := gicWords(gicDistLayout(irqs)), int(irqs-gicPrivateIRQs)/32
	if s.GICv2 {
		distWords, levelWords = gicWords(gicV2DistLayout(irqs)), 0
	}
	if len(s.GICDist) != distWords {
		return fmt.Errorf("vmm: the state has %d distributor words, a GIC of %d interrupts %d", len(s.GICDist), irqs, distWords)
	}
	if len(s.SPILevels) != levelWords {
		return fmt.Errorf("vmm: the state has %d SPI level words, a GIC of %d interrupts %d", len(s.SPILevels), irqs, levelWords)
	}
	for i := range s.VCPUs {
		if err := s.VCPUs[i].validate(s.GICv2); err != nil {
			return fmt.Errorf("vmm: the state of vCPU %d: %w", i, err)
		}
	}
	return nil
}

// validate checks one vCPU's shape, whose GIC part is a GICv2's if v2.
func (c *ARM64VCPUState) validate(v2 bool) error {
	if len(c.Regs) == 0 || len(c.Regs) > kvm.MaxRegListLength {
		return fmt.Errorf("%d registers, want 1 to %d", len(c.Regs), kvm.MaxRegListLength)
	}
	seen := make(map[uint64]bool, len(c.Regs))
	for _, r := range c.Regs {
		size := kvm.RegSize(r.ID)
		if size > kvm.MaxOneRegBytes || len(r.Value) != size {
			return fmt.Errorf("register %#x holds %d bytes, its id says %d", r.ID, len(r.Value), size)
		}
		if seen[r.ID] {
			return fmt.Errorf("register %#x twice", r.ID)
		}
		seen[r.ID] = true
	}
	switch kvm.MPState(c.MPState) {
	case kvm.MPStateRunnable, kvm.MPStateStopped, kvm.MPStateSuspended:
	default:
		return fmt.Errorf("MP state %d, not one of an arm64 vCPU's", c.MPState)
	}
	if v2 {
		return c.validateGICv2()
	}
	if len(c.GICRedist) != gicWords(gicRedistLayout) {
		return fmt.Errorf("%d redistributor words, want %d", len(c.GICRedist), gicWords(gicRedistLayout))
	}
	if len(c.GICCPU) < 2 {
		return fmt.Errorf("%d GIC CPU interface registers", len(c.GICCPU))
	}
	if want := len(iccLayout(c.GICCPU[1])); len(c.GICCPU) != want {
		return fmt.Errorf("%d GIC CPU interface registers, its ICC_CTLR_EL1 %#x says %d", len(c.GICCPU), c.GICCPU[1], want)
	}
	return nil
}
