package vmm

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// A GICv2's saved state (ARM64State.GICv2). KVM's GICv2 device names a
// register by the vCPU's index and its offset in the distributor's or the
// CPU interface's frame (kvm.VGICV2RegAttr); the distributor banks the
// first 32 interrupts' registers per vCPU. Offsets from the GICv2
// architecture specification; KVM's vgic-mmio-v2.c serves each of them to
// user space.
const (
	gicv2dSPENDSGIR = 0x0F20 // GICD_SPENDSGIRn: pending SGIs by source, 4 words

	gicv2cCTLR = 0x00
	gicv2cPMR  = 0x04
	gicv2cBPR  = 0x08
	gicv2cABPR = 0x1C
	gicv2cAPR0 = 0xD0 // the only active-priority register KVM's GICv2 has
)

// gicV2DistLayout lists the shared distributor registers a snapshot holds
// for a GICv2 of irqs interrupts, the SPIs' only, in restore order:
// GICD_IIDR first (as for the GICv3), the configuration with the SPIs'
// CPU targets, then the enable, pending and active bits, GICD_CTLR last.
func gicV2DistLayout(irqs uint32) (config, state []gicRange) {
	spis := int(irqs) - gicPrivateIRQs
	return spiDistLayout(irqs, gicRange{"GICD_ITARGETSR", gicdITARGETSR + gicPrivateIRQs, spis / 4})
}

// gicV2BankedLayout lists the distributor registers a GICv2 banks per
// vCPU (its SGIs and PPIs), in restore order: configuration, then the
// enable, pending and active bits and the SGIs pending by source. The
// SGIs' GICD_ICFGR0 and the private GICD_ITARGETSR are read-only.
var gicV2BankedLayout = []gicRange{
	{"GICD_IGROUPR0", gicdIGROUPR, 1},
	{"GICD_ICFGR1", gicdICFGR + 4, 1},
	{"GICD_IPRIORITYR0", gicdIPRIORITYR, gicPrivateIRQs / 4},
	{"GICD_ISENABLER0", gicdISENABLER, 1},
	{"GICD_ISPENDR0", gicdISPENDR, 1},
	{"GICD_ISACTIVER0", gicdISACTIVER, 1},
	{"GICD_SPENDSGIR", gicv2dSPENDSGIR, 4},
}

// gicV2CPULayout lists a vCPU's GICv2 CPU interface registers, in restore
// order: priority mask, binary points and active priorities, GICC_CTLR
// (which enables the interface) last.
var gicV2CPULayout = []gicRange{
	{"GICC_PMR", gicv2cPMR, 1},
	{"GICC_BPR", gicv2cBPR, 1},
	{"GICC_ABPR", gicv2cABPR, 1},
	{"GICC_APR0", gicv2cAPR0, 1},
	{"GICC_CTLR", gicv2cCTLR, 1},
}

// saveGICv2 reads a GICv2 into s: each vCPU's banked distributor
// registers and CPU interface, then the shared distributor.
func saveGICv2(vcpus []armVCPU, gic gicDevice, s *ARM64State) error {
	for i := range vcpus {
		cs := &s.VCPUs[i]
		var err error
		if cs.GICRedist, err = readGICWords(gic, kvm.VGICGroupDistRegs, v2Attr(i), gicV2BankedLayout); err != nil {
			return fmt.Errorf("vmm: saving vCPU %d's GICv2 distributor bank: %w", i, err)
		}
		cpu, err := readGICWords(gic, kvm.VGICGroupCPURegs, v2Attr(i), gicV2CPULayout)
		if err != nil {
			return fmt.Errorf("vmm: saving vCPU %d's GICv2 CPU interface: %w", i, err)
		}
		cs.GICCPU = make([]uint64, len(cpu))
		for j, w := range cpu {
			cs.GICCPU[j] = uint64(w)
		}
	}
	config, state := gicV2DistLayout(s.GICIRQs)
	var err error
	if s.GICDist, err = readGICWords(gic, kvm.VGICGroupDistRegs, v2Attr(0), config, state); err != nil {
		return fmt.Errorf("vmm: saving the GICv2 distributor: %w", err)
	}
	return nil
}

// restoreGICv2 restores a GICv2 in the order KVM needs: the shared
// distributor's IIDR and configuration, each vCPU's bank, the shared
// enable, pending and active bits, each vCPU's CPU interface, and last
// GICD_CTLR, which turns the distributor on.
func restoreGICv2(vcpus int, gic gicDevice, s *ARM64State) error {
	config, state := gicV2DistLayout(s.GICIRQs)
	shared := v2Attr(0)
	rest, err := writeGICWords(gic, kvm.VGICGroupDistRegs, shared, s.GICDist, config)
	if err != nil {
		return fmt.Errorf("vmm: restoring the GICv2 distributor: %w", err)
	}
	for i := range vcpus {
		if _, err := writeGICWords(gic, kvm.VGICGroupDistRegs, v2Attr(i), s.VCPUs[i].GICRedist, gicV2BankedLayout); err != nil {
			return fmt.Errorf("vmm: restoring vCPU %d's GICv2 distributor bank: %w", i, err)
		}
	}
	ctlr := state[len(state)-1:]
	if rest, err = writeGICWords(gic, kvm.VGICGroupDistRegs, shared, rest, state[:len(state)-1]); err != nil {
		return fmt.Errorf("vmm: restoring the GICv2 distributor: %w", err)
	}
	for i := range vcpus {
		cpu := make([]uint32, len(s.VCPUs[i].GICCPU))
		for j, v := range s.VCPUs[i].GICCPU {
			cpu[j] = uint32(v)
		}
		if _, err := writeGICWords(gic, kvm.VGICGroupCPURegs, v2Attr(i), cpu, gicV2CPULayout); err != nil {
			return fmt.Errorf("vmm: restoring vCPU %d's GICv2 CPU interface: %w", i, err)
		}
	}
	if _, err := writeGICWords(gic, kvm.VGICGroupDistRegs, shared, rest, ctlr); err != nil {
		return fmt.Errorf("vmm: restoring the GICv2 distributor: %w", err)
	}
	return nil
}

// validateGICv2 checks the GICv2 part of one vCPU's state: its bank's
// words, and CPU interface registers that are 32-bit values.
func (c *ARM64VCPUState) validateGICv2() error {
	if want := gicWords(gicV2BankedLayout); len(c.GICRedist) != want {
		return fmt.Errorf("%d GICv2 distributor bank words, want %d", len(c.GICRedist), want)
	}
	if want := gicWords(gicV2CPULayout); len(c.GICCPU) != want {
		return fmt.Errorf("%d GICv2 CPU interface registers, want %d", len(c.GICCPU), want)
	}
	for _, v := range c.GICCPU {
		if v>>32 != 0 {
			return fmt.Errorf("a GICv2 CPU interface register of %#x, wider than 32 bits", v)
		}
	}
	return nil
}
