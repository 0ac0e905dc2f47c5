package kvm

import (
	"errors"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestVCPUInitFeatures(t *testing.T) {
	var init VCPUInit
	init.SetFeature(ARMVCPUPSCI02)
	init.SetFeature(ARMVCPUPowerOff)
	init.SetFeature(33)
	init.SetFeature(-1)  // ignored
	init.SetFeature(224) // ignored: beyond the bitmap
	if init.Features != [7]uint32{0b101, 0b10, 0, 0, 0, 0, 0} {
		t.Errorf("features %#x", init.Features)
	}
	if !init.HasFeature(ARMVCPUPSCI02) || init.HasFeature(1) || init.HasFeature(224) {
		t.Errorf("HasFeature wrong for %#x", init.Features)
	}
	if ARMTargetName(5) != "generic v8" || ARMTargetName(42) != "target 42" {
		t.Errorf("target names: %q %q", ARMTargetName(5), ARMTargetName(42))
	}
}

// The constant ids are what the functions compute, and the functions'
// range checks give ids KVM refuses rather than another register's.
func TestARM64RegisterIDFunctions(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"sp", ARM64CoreReg(arm64OffSP), ARM64RegSP},
		{"pc", ARM64CoreReg(arm64OffPC), ARM64RegPC},
		{"pstate", ARM64CoreReg(arm64OffPSTATE), ARM64RegPSTATE},
		{"x30", ARM64CoreReg(30 * 8), ARM64RegX(30)},
		{"MPIDR_EL1", ARM64SysReg(3, 0, 0, 0, 5), ARM64RegMPIDR},
		{"CNTV_CTL", ARM64SysReg(3, 3, 14, 3, 1), ARM64RegCNTVCTL},
		{"CNTV_CVAL", ARM64SysReg(3, 3, 14, 0, 2), ARM64RegCNTVCVAL},
		{"CNTVCT", ARM64SysReg(3, 3, 14, 3, 2), ARM64RegCNTVCT},
	} {
		if c.got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, c.got, c.want)
		}
	}
	valid := map[uint64]bool{ARM64RegSP: true, ARM64RegPC: true, ARM64RegPSTATE: true, ARM64RegSPEL1: true}
	for _, id := range []uint64{ARM64RegX(-1), ARM64RegX(31), ARM64RegV(32), ARM64RegSPSR(5)} {
		if valid[id] || id&0xffff != 0xffff {
			t.Errorf("out-of-range register gave id %#x", id)
		}
	}
	for id, want := range map[uint64]int{ARM64RegPC: 8, ARM64RegV(0): 16, ARM64RegFPSR: 4, ARM64RegMPIDR: 8} {
		if got := RegSize(id); got != want {
			t.Errorf("RegSize(%#x) = %d, want %d", id, got, want)
		}
	}
}

// Sizes are checked before the ioctl: a mismatch never reaches the kernel
// (here a closed vCPU, which would answer EBADF).
func TestOneRegChecksSizes(t *testing.T) {
	c := &VCPU{fd: -1}
	for name, err := range map[string]error{
		"get V0 as 64-bit":        func() error { _, err := c.GetOneReg(ARM64RegV(0)); return err }(),
		"set fpsr beyond 32 bits": c.SetOneReg(ARM64RegFPSR, 1<<32),
		"get V0 into 8 bytes":     c.GetOneRegBytes(ARM64RegV(0), make([]byte, 8)),
		"set pc from 16 bytes":    c.SetOneRegBytes(ARM64RegPC, make([]byte, 16)),
		"get pc into nothing":     c.GetOneRegBytes(ARM64RegPC, nil),
	} {
		if !errors.Is(err, errRegSize) {
			t.Errorf("%s: %v, want a size error", name, err)
		}
	}
	for name, err := range map[string]error{
		"get pc":            func() error { _, err := c.GetOneReg(ARM64RegPC); return err }(),
		"set fpsr":          c.SetOneReg(ARM64RegFPSR, 1<<31),
		"get V0 (16 bytes)": c.GetOneRegBytes(ARM64RegV(0), make([]byte, 16)),
	} {
		if !errors.Is(err, unix.EBADF) {
			t.Errorf("%s: %v, want the ioctl's EBADF", name, err)
		}
	}
}

// KVM_GET_REG_LIST's count comes from the kernel: a huge one is refused
// before any allocation, and one larger than the buffer is an error.
func TestRegListBounded(t *testing.T) {
	want := []uint64{ARM64RegX(0), ARM64RegPC, ARM64RegMPIDR}
	kernel := func(count uint64, regs []uint64) func([]uint64) (uint64, error) {
		return func(ids []uint64) (uint64, error) {
			if uint64(len(ids)) < count {
				return count, unix.E2BIG
			}
			copy(ids, regs)
			return count, nil
		}
	}
	got, err := boundedRegList(kernel(3, want))
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("list %#x, %v; want %#x", got, err, want)
	}
	if got, err := boundedRegList(kernel(1<<40, nil)); err == nil || got != nil {
		t.Errorf("count 2^40: %d ids, %v; want a refusal", len(got), err)
	}
	if _, err := boundedRegList(kernel(MaxRegListLength+1, nil)); err == nil {
		t.Errorf("count %d accepted", MaxRegListLength+1)
	}
	lying := func(ids []uint64) (uint64, error) {
		if ids == nil {
			return 2, unix.E2BIG
		}
		return 5, nil // copied more than there was room for
	}
	if _, err := boundedRegList(lying); err == nil {
		t.Error("a count beyond the buffer was accepted")
	}
	failing := func([]uint64) (uint64, error) { return 0, unix.ENOEXEC }
	if _, err := boundedRegList(failing); !errors.Is(err, unix.ENOEXEC) {
		t.Errorf("uninitialised vCPU: %v, want ENOEXEC", err)
	}
	if got, err := boundedRegList(kernel(0, nil)); err != nil || len(got) != 0 {
		t.Errorf("no registers: %v %v", got, err)
	}
}

func TestARMIRQLineSPI(t *testing.T) {
	// SPI 1 (the UART) is INTID 33: type 1 in bits 24-27, vCPU 0, INTID.
	if got := ARMIRQLineSPI(33); got != 1<<24|33 {
		t.Errorf("SPI INTID 33: %#x", got)
	}
	if got := ARMIRQLineSPI(0x1_0021); got != 1<<24|0x21 {
		t.Errorf("INTID beyond 16 bits leaked into the vCPU field: %#x", got)
	}
}

// The per-vCPU VGIC attributes name a vCPU by its packed affinity
// (Aff3.Aff2.Aff1.Aff0, without MPIDR's RES1 bit 31) in bits 32-63.
func TestVGICAttributes(t *testing.T) {
	const mpidr0 = 0x8000_0000             // vCPU 0: only the RES1 bit
	const mpidrFar = 0x0000_0001_8002_0304 // Aff3 1, Aff2 2, Aff1 3, Aff0 4
	if got := VGICV3RegAttr(mpidr0, 0x10); got != 0x10 {
		t.Errorf("vCPU 0 register attr %#x", got)
	}
	if got := VGICV3RegAttr(mpidrFar, 0x80); got != 0x01020304_00000080 {
		t.Errorf("far vCPU register attr %#x", got)
	}
	// ICC_PMR_EL1 is (3,0,4,6,0); the instruction fills the low 16 bits.
	if got := VGICV3SysregAttr(mpidr0, 3, 0, 4, 6, 0); got != 3<<14|4<<7|6<<3 || got&^0xffff != 0 {
		t.Errorf("ICC_PMR_EL1 attr %#x", got)
	}
	// Line levels of INTIDs 64..95: LINE_LEVEL (0) at bit 10, the INTID below.
	if got := VGICV3LevelInfoAttr(mpidr0, 64); got != 64 {
		t.Errorf("level info attr %#x", got)
	}
}

func TestARM64IdentityReg(t *testing.T) {
	for id, want := range map[uint64]bool{
		ARM64SysReg(3, 0, 0, 0, 0):                   true, // MIDR_EL1
		ARM64RegMPIDR:                                true,
		ARM64SysReg(3, 0, 0, 4, 0):                   true,  // ID_AA64PFR0_EL1
		ARM64SysReg(3, 3, 0, 0, 1):                   true,  // CTR_EL0
		ARM64SysReg(3, 1, 0, 0, 1):                   true,  // CLIDR_EL1
		kvmRegARM64 | kvmRegSizeU32 | kvmRegARMDemux: true,  // CCSIDR_EL1 of level 1 data
		ARM64SysReg(3, 0, 1, 0, 0):                   false, // SCTLR_EL1
		ARM64SysReg(3, 2, 0, 0, 0):                   false, // CSSELR_EL1
		ARM64RegCNTVCT:                               false,
		ARM64RegPC:                                   false,
		ARM64RegPSCIVersion:                          false,
	} {
		if got := ARM64IdentityReg(id); got != want {
			t.Errorf("ARM64IdentityReg(%#x) = %v, want %v", id, got, want)
		}
	}
}
