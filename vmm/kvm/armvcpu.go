package kvm

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// The arm64 ioctls. KVM encodes them with the generic _IOC scheme, the same
// on amd64 and arm64, so they compile everywhere; on a non-arm64 KVM they
// fail with ENOTTY or EINVAL. Values from <linux/kvm.h>, checked by the
// arm64 layout test.
const (
	ioctlARMPreferredTarget = 0x8020aeaf // _IOR(KVMIO, 0xaf, struct kvm_vcpu_init)
	ioctlARMVCPUInit        = 0x4020aeae // _IOW(KVMIO, 0xae, struct kvm_vcpu_init)
	ioctlGetOneReg          = 0x4010aeab // _IOW(KVMIO, 0xab, struct kvm_one_reg)
	ioctlSetOneReg          = 0x4010aeac // _IOW(KVMIO, 0xac, struct kvm_one_reg)
	ioctlGetRegList         = 0xc008aeb0 // _IOWR(KVMIO, 0xb0, struct kvm_reg_list)
)

// VCPUInit mirrors struct kvm_vcpu_init (32 bytes): the CPU model
// (KVM_ARM_TARGET_*) and the feature bitmap (KVM_ARM_VCPU_*) an arm64 vCPU
// is initialised with.
type VCPUInit struct {
	Target   uint32
	Features [7]uint32
}

// vCPU feature bits for VCPUInit.SetFeature (KVM_ARM_VCPU_*).
const (
	// ARMVCPUPowerOff starts the vCPU powered off: a secondary waits for
	// the guest's PSCI CPU_ON.
	ARMVCPUPowerOff = 0
	// ARMVCPUPSCI02 gives the vCPU PSCI 0.2 (and later) instead of 0.1.
	ARMVCPUPSCI02 = 2
)

// SetFeature sets feature bit (ARMVCPU…) in the bitmap. A bit beyond the
// bitmap's 224 is ignored: no such feature exists.
func (i *VCPUInit) SetFeature(bit int) {
	if bit < 0 || bit >= 32*len(i.Features) {
		return
	}
	i.Features[bit/32] |= 1 << (bit % 32)
}

// HasFeature reports whether feature bit is set.
func (i *VCPUInit) HasFeature(bit int) bool {
	if bit < 0 || bit >= 32*len(i.Features) {
		return false
	}
	return i.Features[bit/32]&(1<<(bit%32)) != 0
}

// KVM_ARM_TARGET_* values KVM_ARM_PREFERRED_TARGET may give.
var armTargetNames = map[uint32]string{
	0: "AEM v8", 1: "Foundation v8", 2: "Cortex-A57", 3: "X-Gene Potenza",
	4: "Cortex-A53", 5: "generic v8",
}

// ARMTargetName is the kernel's name for a KVM_ARM_TARGET_* number.
func ARMTargetName(target uint32) string {
	if n, ok := armTargetNames[target]; ok {
		return n
	}
	return "target " + itoa(uint64(target))
}

// ARMPreferredTarget issues KVM_ARM_PREFERRED_TARGET on the VM: the
// VCPUInit that suits this host's CPUs, features cleared.
func (vm *VM) ARMPreferredTarget() (VCPUInit, error) {
	var init VCPUInit
	if _, err := ioctlStruct(vm.fd, ioctlARMPreferredTarget, &init); err != nil {
		return init, fmt.Errorf("KVM_ARM_PREFERRED_TARGET: %w", err)
	}
	return init, nil
}

// ARMInit issues KVM_ARM_VCPU_INIT: resets the vCPU to the target and
// features of init. It must precede the vCPU's first KVM_RUN and register
// access, with the target ARMPreferredTarget gave.
func (c *VCPU) ARMInit(init VCPUInit) error {
	if _, err := ioctlStruct(c.fd, ioctlARMVCPUInit, &init); err != nil {
		return fmt.Errorf("KVM_ARM_VCPU_INIT vCPU %d (target %d, features %#x): %w", c.id, init.Target, init.Features, err)
	}
	return nil
}

// Register ids (KVM_REG_*, <linux/kvm.h> and arm64's <asm/kvm.h>): an
// architecture, a size and an architecture-specific index.
const (
	kvmRegARM64      = 0x6000000000000000
	kvmRegArchMask   = 0xff00000000000000
	kvmRegSizeShift  = 52
	kvmRegSizeMask   = 0x00f0000000000000
	kvmRegSizeU32    = 0x0020000000000000
	kvmRegSizeU64    = 0x0030000000000000
	kvmRegSizeU128   = 0x0040000000000000
	kvmRegARMCore    = 0x0010 << 16
	kvmRegARM64Sys   = 0x0013 << 16
	kvmRegARMFW      = 0x0014 << 16
	kvmRegARMDemux   = 0x0011 << 16
	kvmRegCoprocMask = 0x0fff0000
)

// Bounds of arm64 register access, which a snapshot's registers are held to.
const (
	// MaxOneRegBytes is KVM_REG_SIZE_U2048, the largest register size the
	// encoding has.
	MaxOneRegBytes = 256
	// MaxRegListLength bounds KVM_GET_REG_LIST's count: a 6.1 arm64 vCPU
	// with SVE has under 1000.
	MaxRegListLength = 4096
)

// RegSize is the size in bytes KVM_REG_SIZE encodes in a register id.
func RegSize(id uint64) int {
	return 1 << ((id & kvmRegSizeMask) >> kvmRegSizeShift)
}

// Offsets into arm64's struct kvm_regs, whose core registers KVM exposes
// one 32-bit word at a time: user_pt_regs (regs[31], sp, pc, pstate),
// then sp_el1, elr_el1, spsr[5], and fp_regs (vregs[32] of 128 bits,
// 16-byte aligned, then fpsr and fpcr). Checked against the kernel's
// offsetof in the arm64 layout test.
const (
	arm64OffSP     = 31 * 8
	arm64OffPC     = 32 * 8
	arm64OffPSTATE = 33 * 8
	arm64OffSPEL1  = 34 * 8
	arm64OffELREL1 = 35 * 8
	arm64OffSPSR   = 36 * 8
	arm64OffVRegs  = 336
	arm64OffFPSR   = arm64OffVRegs + 32*16
	arm64OffFPCR   = arm64OffFPSR + 4
)

// ARM64CoreReg is the id of the 64-bit core register at offset in
// struct kvm_regs (KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE |
// offset/4).
func ARM64CoreReg(offset uintptr) uint64 {
	return kvmRegARM64 | kvmRegSizeU64 | kvmRegARMCore | uint64(offset/4)
}

// arm64 core register ids (ARM64CoreReg of their offsets).
const (
	ARM64RegSP     uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARMCore | arm64OffSP/4     // SP_EL0
	ARM64RegPC     uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARMCore | arm64OffPC/4     // PC
	ARM64RegPSTATE uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARMCore | arm64OffPSTATE/4 // PSTATE (SPSR format)
	ARM64RegSPEL1  uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARMCore | arm64OffSPEL1/4  // SP_EL1
	ARM64RegELREL1 uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARMCore | arm64OffELREL1/4 // ELR_EL1
	// ARM64RegFPSR and ARM64RegFPCR are 32-bit.
	ARM64RegFPSR uint64 = kvmRegARM64 | kvmRegSizeU32 | kvmRegARMCore | arm64OffFPSR/4
	ARM64RegFPCR uint64 = kvmRegARM64 | kvmRegSizeU32 | kvmRegARMCore | arm64OffFPCR/4
)

// ARM64RegX is the id of general-purpose register Xn (0..30); n outside
// that range gives an id KVM refuses.
func ARM64RegX(n int) uint64 {
	if n < 0 || n > 30 {
		return kvmRegARM64 | kvmRegSizeU64 | kvmRegARMCore | 0xffff
	}
	return ARM64CoreReg(uintptr(n) * 8)
}

// ARM64RegSPSR is the id of spsr[n] (0..4: EL1, abt, und, irq, fiq).
func ARM64RegSPSR(n int) uint64 {
	if n < 0 || n > 4 {
		return kvmRegARM64 | kvmRegSizeU64 | kvmRegARMCore | 0xffff
	}
	return ARM64CoreReg(arm64OffSPSR + uintptr(n)*8)
}

// ARM64RegV is the id of the 128-bit SIMD register Vn (0..31), for
// GetOneRegBytes / SetOneRegBytes with a 16-byte buffer.
func ARM64RegV(n int) uint64 {
	if n < 0 || n > 31 {
		return kvmRegARM64 | kvmRegSizeU128 | kvmRegARMCore | 0xffff
	}
	return kvmRegARM64 | kvmRegSizeU128 | kvmRegARMCore | uint64(arm64OffVRegs+16*n)/4
}

// ARM64SysReg is the id of a system register by its encoding
// (KVM_REG_ARM64_SYSREG: op0<<14 | op1<<11 | CRn<<7 | CRm<<3 | op2).
func ARM64SysReg(op0, op1, crn, crm, op2 uint64) uint64 {
	return kvmRegARM64 | kvmRegSizeU64 | kvmRegARM64Sys |
		(op0&3)<<14 | (op1&7)<<11 | (crn&0xf)<<7 | (crm&0xf)<<3 | op2&7
}

// arm64 system and firmware register ids (ARM64SysReg of their encodings).
const (
	// ARM64RegMPIDR is MPIDR_EL1 (3,0,0,0,5): the vCPU's affinity, which
	// the device tree's cpu reg and the GIC redistributors name it by.
	ARM64RegMPIDR uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARM64Sys | 3<<14 | 5
	// The virtual timer, as KVM exposes it: control (3,3,14,3,1), compare
	// value (3,3,14,0,2) and the counter (3,3,14,3,2). The counter and
	// compare ids are swapped against the architectural encodings, a
	// historical accident KVM keeps.
	ARM64RegCNTVCTL  uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARM64Sys | 3<<14 | 3<<11 | 14<<7 | 3<<3 | 1
	ARM64RegCNTVCVAL uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARM64Sys | 3<<14 | 3<<11 | 14<<7 | 0<<3 | 2
	ARM64RegCNTVCT   uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARM64Sys | 3<<14 | 3<<11 | 14<<7 | 3<<3 | 2
	// ARM64RegPSCIVersion is the PSCI version KVM offers the guest
	// (KVM_REG_ARM_PSCI_VERSION).
	ARM64RegPSCIVersion uint64 = kvmRegARM64 | kvmRegSizeU64 | kvmRegARMFW
)

// ARM64IdentityReg says whether register id describes the CPU rather
// than holds guest state, so that KVM takes a write of it only of the
// value it has (it calls them invariant): the ID register space (op0 3,
// op1 0, CRn 0: MIDR_EL1, MPIDR_EL1, REVIDR_EL1, the ID_* registers),
// CTR_EL0, CLIDR_EL1, AIDR_EL1 and the cache geometry (CCSIDR_EL1 per
// level, KVM_REG_ARM_DEMUX).
func ARM64IdentityReg(id uint64) bool {
	switch id & kvmRegCoprocMask {
	case kvmRegARMDemux:
		return true
	case kvmRegARM64Sys:
	default:
		return false
	}
	enc := id & 0xffff
	op0, op1, crn, crm, op2 := enc>>14, enc>>11&7, enc>>7&0xf, enc>>3&0xf, enc&7
	switch {
	case op0 == 3 && op1 == 0 && crn == 0:
		return true
	case op0 == 3 && op1 == 3 && crn == 0 && crm == 0 && op2 == 1: // CTR_EL0
		return true
	case op0 == 3 && op1 == 1 && crn == 0 && crm == 0 && (op2 == 1 || op2 == 7): // CLIDR, AIDR
		return true
	}
	return false
}

// errRegSize is a register access whose buffer does not fit the id.
var errRegSize = errors.New("register size mismatch")

// GetOneReg issues KVM_GET_ONE_REG for a register of at most 64 bits,
// zero-extended.
func (c *VCPU) GetOneReg(id uint64) (uint64, error) {
	size := RegSize(id)
	if size > 8 {
		return 0, fmt.Errorf("KVM_GET_ONE_REG %#x vCPU %d: %w: a %d-byte register needs GetOneRegBytes", id, c.id, errRegSize, size)
	}
	var buf [8]byte
	if err := oneReg(c.fd, ioctlGetOneReg, id, buf[:size]); err != nil {
		return 0, fmt.Errorf("KVM_GET_ONE_REG %#x vCPU %d: %w", id, c.id, err)
	}
	return binary.LittleEndian.Uint64(buf[:]), nil
}

// SetOneReg issues KVM_SET_ONE_REG for a register of at most 64 bits;
// v must fit the register's size.
func (c *VCPU) SetOneReg(id uint64, v uint64) error {
	size := RegSize(id)
	if size > 8 || (size < 8 && v>>(8*size) != 0) {
		return fmt.Errorf("KVM_SET_ONE_REG %#x vCPU %d: %w: value %#x for a %d-byte register", id, c.id, errRegSize, v, size)
	}
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], v)
	if err := oneReg(c.fd, ioctlSetOneReg, id, buf[:size]); err != nil {
		return fmt.Errorf("KVM_SET_ONE_REG %#x vCPU %d: %w", id, c.id, err)
	}
	return nil
}

// GetOneRegBytes issues KVM_GET_ONE_REG into buf, whose length must be the
// id's KVM_REG_SIZE (16 for a V register), in the kernel's byte order.
func (c *VCPU) GetOneRegBytes(id uint64, buf []byte) error {
	if err := checkRegBuffer(id, buf); err != nil {
		return fmt.Errorf("KVM_GET_ONE_REG %#x vCPU %d: %w", id, c.id, err)
	}
	if err := oneReg(c.fd, ioctlGetOneReg, id, buf); err != nil {
		return fmt.Errorf("KVM_GET_ONE_REG %#x vCPU %d: %w", id, c.id, err)
	}
	return nil
}

// SetOneRegBytes issues KVM_SET_ONE_REG from buf, whose length must be the
// id's KVM_REG_SIZE.
func (c *VCPU) SetOneRegBytes(id uint64, buf []byte) error {
	if err := checkRegBuffer(id, buf); err != nil {
		return fmt.Errorf("KVM_SET_ONE_REG %#x vCPU %d: %w", id, c.id, err)
	}
	if err := oneReg(c.fd, ioctlSetOneReg, id, buf); err != nil {
		return fmt.Errorf("KVM_SET_ONE_REG %#x vCPU %d: %w", id, c.id, err)
	}
	return nil
}

func checkRegBuffer(id uint64, buf []byte) error {
	if size := RegSize(id); len(buf) != size || size > MaxOneRegBytes {
		return fmt.Errorf("%w: %d-byte buffer for a %d-byte register", errRegSize, len(buf), size)
	}
	return nil
}

// RegList issues KVM_GET_REG_LIST: the ids of every register this vCPU
// has (after ARMInit), which a snapshot saves.
func (c *VCPU) RegList() ([]uint64, error) {
	ids, err := boundedRegList(func(ids []uint64) (uint64, error) { return regList(c.fd, ids) })
	if err != nil {
		return nil, fmt.Errorf("KVM_GET_REG_LIST vCPU %d: %w", c.id, err)
	}
	return ids, nil
}

// boundedRegList asks fetch (KVM_GET_REG_LIST with room for len(ids))
// first for the count, then for the ids. A count above MaxRegListLength
// is refused rather than allocated, and one the kernel would overflow the
// buffer with is an error.
func boundedRegList(fetch func(ids []uint64) (uint64, error)) ([]uint64, error) {
	// First with room for none: KVM answers E2BIG and the count.
	n, err := fetch(nil)
	switch {
	case err == nil:
		return []uint64{}, nil
	case !errors.Is(err, unix.E2BIG):
		return nil, err
	case n > MaxRegListLength:
		return nil, fmt.Errorf("%d registers, more than the %d this VMM accepts", n, MaxRegListLength)
	}
	ids := make([]uint64, n)
	got, err := fetch(ids)
	if err != nil {
		return nil, fmt.Errorf("%d registers: %w", n, err)
	}
	if got > uint64(len(ids)) {
		return nil, fmt.Errorf("%d registers, room for %d", got, len(ids))
	}
	return ids[:got], nil
}

// ARM IRQ types for KVM_IRQ_LINE's irq field (KVM_ARM_IRQ_TYPE_*).
const (
	armIRQTypeShift = 24
	armIRQTypeSPI   = 1
	armIRQNumMask   = 0xffff
)

// ARMIRQLineSPI is KVM_IRQ_LINE's irq value on arm64 for the shared
// peripheral interrupt with GIC INTID intid (32 + the SPI's index), as
// VM.IRQLine takes it: type SPI (1) in bits 24-27, vCPU 0, the INTID in
// bits 0-15 (intid above 0xffff is cut, and KVM refuses an INTID its GIC
// does not have).
func ARMIRQLineSPI(intid uint32) uint32 {
	return armIRQTypeSPI<<armIRQTypeShift | intid&armIRQNumMask
}
