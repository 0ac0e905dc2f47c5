package vmm

import (
	"bytes"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// armVCPU is what saving and restoring an arm64 vCPU uses of it
// (*kvm.VCPU; a fake in the tests, which run on any host).
type armVCPU interface {
	RegList() ([]uint64, error)
	GetOneReg(id uint64) (uint64, error)
	GetOneRegBytes(id uint64, buf []byte) error
	SetOneRegBytes(id uint64, buf []byte) error
	GetMPState() (kvm.MPState, error)
	SetMPState(kvm.MPState) error
	GetVCPUEvents() (kvm.VCPUEvents, error)
	SetVCPUEvents(kvm.VCPUEvents) error
}

// gicDevice is what saving and restoring the GICv3 uses of it
// (*kvm.Device).
type gicDevice interface {
	GetAttr(group uint32, attr uint64) (uint64, error)
	SetAttr(group uint32, attr uint64, val *uint64) error
}

// saveARM64 reads the state of a paused arm64 VM: its vCPUs and its GIC
// of irqs interrupts, a GICv3 or a GICv2 (kind).
func saveARM64(vcpus []armVCPU, gic gicDevice, kind arm64.GIC, irqs uint32) (*ARM64State, error) {
	s := &ARM64State{GICIRQs: irqs, GICv2: kind == arm64.GICv2}
	for i, c := range vcpus {
		cs, err := saveARM64VCPU(c)
		if err != nil {
			return nil, fmt.Errorf("vmm: saving vCPU %d: %w", i, err)
		}
		s.VCPUs = append(s.VCPUs, cs)
	}
	save := saveGICv3
	if s.GICv2 {
		save = saveGICv2
	}
	if err := save(vcpus, gic, s); err != nil {
		return nil, err
	}
	return s, nil
}

// saveGICv3 reads a GICv3 into s: each vCPU's redistributor and CPU
// interface, the distributor, the SPIs' line levels.
func saveGICv3(vcpus []armVCPU, gic gicDevice, s *ARM64State) error {
	for i, c := range vcpus {
		mpidr, err := c.GetOneReg(kvm.ARM64RegMPIDR)
		if err != nil {
			return err
		}
		cs := &s.VCPUs[i]
		if cs.GICRedist, err = readGICWords(gic, kvm.VGICGroupRedistRegs, v3Attr(mpidr), gicRedistLayout); err != nil {
			return fmt.Errorf("vmm: saving vCPU %d's redistributor: %w", i, err)
		}
		if cs.GICCPU, err = readICC(gic, mpidr); err != nil {
			return fmt.Errorf("vmm: saving vCPU %d's GIC CPU interface: %w", i, err)
		}
	}
	config, state := gicDistLayout(s.GICIRQs)
	var err error
	if s.GICDist, err = readGICWords(gic, kvm.VGICGroupDistRegs, v3Attr(0), config, state); err != nil {
		return fmt.Errorf("vmm: saving the GIC distributor: %w", err)
	}
	for intid := uint32(gicPrivateIRQs); intid < s.GICIRQs; intid += 32 {
		level, err := gic.GetAttr(kvm.VGICGroupLevelInfo, kvm.VGICV3LevelInfoAttr(0, intid))
		if err != nil {
			return fmt.Errorf("vmm: saving the SPI levels: %w", err)
		}
		s.SPILevels = append(s.SPILevels, uint32(level))
	}
	return nil
}

// saveARM64VCPU reads every register the vCPU lists, its MP state and
// its pending events.
func saveARM64VCPU(c armVCPU) (s ARM64VCPUState, err error) {
	ids, err := c.RegList()
	if err != nil {
		return s, err
	}
	if len(ids) > kvm.MaxRegListLength {
		return s, fmt.Errorf("%d registers, more than %d", len(ids), kvm.MaxRegListLength)
	}
	s.Regs = make([]ARM64Reg, 0, len(ids))
	for _, id := range ids {
		size := kvm.RegSize(id)
		if size > kvm.MaxOneRegBytes {
			return s, fmt.Errorf("register %#x of %d bytes", id, size)
		}
		r := ARM64Reg{ID: id, Value: make([]byte, size)}
		if err := c.GetOneRegBytes(id, r.Value); err != nil {
			return s, err
		}
		s.Regs = append(s.Regs, r)
	}
	mp, err := c.GetMPState()
	if err != nil {
		return s, err
	}
	s.MPState = uint32(mp)
	s.Events, err = c.GetVCPUEvents()
	return s, err
}

// gicAttr is the KVM attribute of the GIC register at offset in one
// frame: a GICv3's names the vCPU by MPIDR (v3Attr), a GICv2's by index
// (v2Attr).
type gicAttr func(offset uint32) uint64

func v3Attr(mpidr uint64) gicAttr {
	return func(off uint32) uint64 { return kvm.VGICV3RegAttr(mpidr, off) }
}

func v2Attr(cpu int) gicAttr {
	return func(off uint32) uint64 { return kvm.VGICV2RegAttr(cpu, off) }
}

// readGICWords reads the 32-bit registers of ranges, one word at a time
// (KVM's VGIC register attributes are 32-bit: a 64-bit register is its two
// halves), of the frame that group and attr name.
func readGICWords(gic gicDevice, group uint32, attr gicAttr, ranges ...[]gicRange) ([]uint32, error) {
	out := make([]uint32, 0, gicWords(ranges...))
	for _, rs := range ranges {
		for _, r := range rs {
			for w := range r.words {
				v, err := gic.GetAttr(group, attr(r.offset+uint32(4*w)))
				if err != nil {
					return nil, fmt.Errorf("%s: %w", r.name, err)
				}
				out = append(out, uint32(v))
			}
		}
	}
	return out, nil
}

// writeGICWords writes words, which readGICWords read of ranges, back,
// and returns the words left over.
func writeGICWords(gic gicDevice, group uint32, attr gicAttr, words []uint32, ranges []gicRange) ([]uint32, error) {
	for _, r := range ranges {
		for w := range r.words {
			v := uint64(words[0])
			words = words[1:]
			if err := gic.SetAttr(group, attr(r.offset+uint32(4*w)), &v); err != nil {
				return nil, fmt.Errorf("%s: %w", r.name, err)
			}
		}
	}
	return words, nil
}

// readICC reads the CPU interface registers of the vCPU of mpidr: its
// ICC_CTLR_EL1 first, which says how many there are.
func readICC(gic gicDevice, mpidr uint64) ([]uint64, error) {
	ctlr, err := gic.GetAttr(kvm.VGICGroupCPUSysregs, iccCTLR.attr(mpidr))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", iccCTLR.name, err)
	}
	layout := iccLayout(ctlr)
	out := make([]uint64, 0, len(layout))
	for _, r := range layout {
		v, err := gic.GetAttr(kvm.VGICGroupCPUSysregs, r.attr(mpidr))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// restoreARM64 gives a fresh arm64 VM (vCPUs initialised, GIC of kind
// with irqs interrupts initialised, nothing run) the state s, which it
// checks first. The vCPUs' registers come first: the GIC names each
// vCPU's redistributor and CPU interface by its MPIDR_EL1, and KVM
// restores a vCPU's GIC view onto what its registers hold. Then the GIC
// (restoreGIC's or restoreGICv2's order).
func restoreARM64(vcpus []armVCPU, gic gicDevice, kind arm64.GIC, irqs uint32, s *ARM64State) error {
	if err := s.validate(len(vcpus), kind, irqs); err != nil {
		return err
	}
	for i, c := range vcpus {
		if err := sameHost(c, gic, &s.VCPUs[i], kind); err != nil {
			return fmt.Errorf("vmm: vCPU %d: %w", i, err)
		}
	}
	for i, c := range vcpus {
		if err := restoreARM64VCPU(c, &s.VCPUs[i]); err != nil {
			return fmt.Errorf("vmm: restoring vCPU %d: %w", i, err)
		}
	}
	if kind == arm64.GICv2 {
		return restoreGICv2(len(vcpus), gic, s)
	}
	return restoreGIC(vcpus, gic, s)
}

// restoreARM64VCPU sets every saved register in the order KVM listed
// them, then the pending events and the MP state: a secondary powered off
// when saved stays off, one the guest had started runs.
func restoreARM64VCPU(c armVCPU, s *ARM64VCPUState) error {
	for _, r := range s.Regs {
		if err := c.SetOneRegBytes(r.ID, r.Value); err != nil {
			return err
		}
	}
	if err := c.SetVCPUEvents(s.Events); err != nil {
		return err
	}
	return c.SetMPState(kvm.MPState(s.MPState))
}

// restoreGIC restores the GIC in the order KVM needs: the distributor's
// IIDR and configuration, each vCPU's redistributor, the SPIs' line
// levels, the distributor's enable, pending and active bits, each vCPU's
// CPU interface, and last GICD_CTLR (gicDistLayout says why).
func restoreGIC(vcpus []armVCPU, gic gicDevice, s *ARM64State) error {
	config, state := gicDistLayout(s.GICIRQs)
	rest, err := writeGICWords(gic, kvm.VGICGroupDistRegs, v3Attr(0), s.GICDist, config)
	if err != nil {
		return fmt.Errorf("vmm: restoring the GIC distributor: %w", err)
	}
	mpidrs := make([]uint64, len(vcpus))
	for i, c := range vcpus {
		if mpidrs[i], err = c.GetOneReg(kvm.ARM64RegMPIDR); err != nil {
			return err
		}
		if _, err := writeGICWords(gic, kvm.VGICGroupRedistRegs, v3Attr(mpidrs[i]), s.VCPUs[i].GICRedist, gicRedistLayout); err != nil {
			return fmt.Errorf("vmm: restoring vCPU %d's redistributor: %w", i, err)
		}
	}
	for i, level := range s.SPILevels {
		v := uint64(level)
		if err := gic.SetAttr(kvm.VGICGroupLevelInfo, kvm.VGICV3LevelInfoAttr(0, uint32(gicPrivateIRQs+32*i)), &v); err != nil {
			return fmt.Errorf("vmm: restoring the SPI levels: %w", err)
		}
	}
	ctlr := state[len(state)-1:]
	if rest, err = writeGICWords(gic, kvm.VGICGroupDistRegs, v3Attr(0), rest, state[:len(state)-1]); err != nil {
		return fmt.Errorf("vmm: restoring the GIC distributor: %w", err)
	}
	for i := range vcpus {
		if err := writeICC(gic, mpidrs[i], s.VCPUs[i].GICCPU); err != nil {
			return fmt.Errorf("vmm: restoring vCPU %d's GIC CPU interface: %w", i, err)
		}
	}
	if _, err := writeGICWords(gic, kvm.VGICGroupDistRegs, v3Attr(0), rest, ctlr); err != nil {
		return fmt.Errorf("vmm: restoring the GIC distributor: %w", err)
	}
	return nil
}

// writeICC writes a vCPU's CPU interface registers back.
func writeICC(gic gicDevice, mpidr uint64, vals []uint64) error {
	for i, r := range iccLayout(vals[1]) {
		v := vals[i]
		if err := gic.SetAttr(kvm.VGICGroupCPUSysregs, r.attr(mpidr), &v); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
	}
	return nil
}

// sameHost checks, before anything is written, that the fresh vCPU c and
// its GIC CPU interface can take the saved s (sameRegisters; sameICC for
// a GICv3's).
func sameHost(c armVCPU, gic gicDevice, s *ARM64VCPUState, kind arm64.GIC) error {
	if err := sameRegisters(c, s.Regs); err != nil {
		return err
	}
	if kind == arm64.GICv2 {
		return nil
	}
	mpidr, err := c.GetOneReg(kvm.ARM64RegMPIDR)
	if err != nil {
		return err
	}
	return sameICC(gic, mpidr, s.GICCPU[1])
}

// sameICC checks that this host's GIC CPU interface offers what the saved
// ICC_CTLR_EL1 ran with: KVM refuses more priority or ID bits than it
// has, or other SEIS or A3V, so the snapshot is of another host.
func sameICC(gic gicDevice, mpidr, saved uint64) error {
	now, err := gic.GetAttr(kvm.VGICGroupCPUSysregs, iccCTLR.attr(mpidr))
	if err != nil {
		return fmt.Errorf("%s: %w", iccCTLR.name, err)
	}
	const idBits, seis, a3v = 7 << 11, 1 << 14, 1 << 15
	if iccPriorityBits(saved) > iccPriorityBits(now) || saved&idBits > now&idBits ||
		saved&(seis|a3v) != now&(seis|a3v) {
		return fmt.Errorf("it ran with ICC_CTLR_EL1 %#x, this host's GIC has %#x: %w", saved, now, snapshot.ErrMismatch)
	}
	return nil
}

// sameRegisters checks that the fresh vCPU c has the registers saved,
// and the same identity registers (kvm.ARM64IdentityReg): KVM refuses to change
// those, so a snapshot taken on another CPU, or under a KVM that lists
// other registers, is snapshot.ErrMismatch (boot afresh), found before
// any register is written.
func sameRegisters(c armVCPU, saved []ARM64Reg) error {
	ids, err := c.RegList()
	if err != nil {
		return err
	}
	if len(ids) != len(saved) {
		return fmt.Errorf("it had %d registers, this one %d: %w", len(saved), len(ids), snapshot.ErrMismatch)
	}
	for i, id := range ids {
		if saved[i].ID != id {
			return fmt.Errorf("its register %d is %#x, this one's %#x: %w", i, saved[i].ID, id, snapshot.ErrMismatch)
		}
		if !kvm.ARM64IdentityReg(id) {
			continue
		}
		now := make([]byte, kvm.RegSize(id))
		if err := c.GetOneRegBytes(id, now); err != nil {
			return err
		}
		if !bytes.Equal(now, saved[i].Value) {
			return fmt.Errorf("it ran on a CPU whose register %#x is %x, this one's %x: %w", id, saved[i].Value, now, snapshot.ErrMismatch)
		}
	}
	return nil
}
