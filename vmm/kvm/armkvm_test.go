package kvm

import (
	"bytes"
	"runtime"
	"slices"
	"testing"
)

// The GICv3 frames these tests place, as the arm64 VMM does (one vCPU).
const (
	testGICDist   = 0x3fff_0000
	testGICRedist = testGICDist - 0x20000
	testGICIRQs   = 128 // 32 private + 96 SPIs
)

// armVMForTest opens an arm64 KVM, creates a VM and vCPU 0 initialised
// with the preferred target and PSCI 0.2, or skips saying why.
func armVMForTest(t *testing.T) (*VM, *VCPU) {
	t.Helper()
	if runtime.GOARCH != "arm64" {
		t.Skipf("needs an arm64 KVM (this is %s); runs in the arm64 harness", runtime.GOARCH)
	}
	s := openForTest(t)
	vm, err := s.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Close() })
	init, err := vm.ARMPreferredTarget()
	if err != nil {
		t.Fatal(err)
	}
	c, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	init.SetFeature(ARMVCPUPSCI02)
	if err := c.ARMInit(init); err != nil {
		t.Fatal(err)
	}
	return vm, c
}

func TestARM64KVMOneReg(t *testing.T) {
	_, c := armVMForTest(t)
	for _, r := range []struct {
		name string
		id   uint64
		v    uint64
	}{{"x0", ARM64RegX(0), 0x4000_0000}, {"pc", ARM64RegPC, 0x8020_0000}, {"pstate", ARM64RegPSTATE, 0x3c5}, {"fpsr", ARM64RegFPSR, 0x8000000}} {
		if err := c.SetOneReg(r.id, r.v); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		if got, err := c.GetOneReg(r.id); err != nil || got != r.v {
			t.Errorf("%s: read back %#x, %v; want %#x", r.name, got, err, r.v)
		}
	}
	v := bytes.Repeat([]byte{0xa5, 0x5a}, 8)
	if err := c.SetOneRegBytes(ARM64RegV(7), v); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 16)
	if err := c.GetOneRegBytes(ARM64RegV(7), back); err != nil || !bytes.Equal(back, v) {
		t.Errorf("V7 read back % x, %v", back, err)
	}
	mpidr, err := c.GetOneReg(ARM64RegMPIDR)
	if err != nil || mpidr&0xff_00ff_ffff != 0 {
		t.Errorf("vCPU 0's MPIDR_EL1 %#x, %v; want affinity 0", mpidr, err)
	}
	// PSCI versions are major<<16 | minor: 0.2 is 2, 1.1 is 0x10001.
	psci, err := c.GetOneReg(ARM64RegPSCIVersion)
	if err != nil || psci < 2 {
		t.Errorf("PSCI version %#x, %v; want 0.2 or later", psci, err)
	}
	ids, err := c.RegList()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{ARM64RegX(0), ARM64RegPC, ARM64RegMPIDR, ARM64RegV(31), ARM64RegCNTVCT} {
		if !slices.Contains(ids, id) {
			t.Errorf("KVM_GET_REG_LIST (%d ids) lacks %#x", len(ids), id)
		}
	}
}

// The GICv3 set up as the VMM does it, and an SPI raised through
// KVM_IRQ_LINE with the arm64 encoding.
func TestARM64KVMGICv3(t *testing.T) {
	vm, _ := armVMForTest(t)
	if err := vm.CanCreateDevice(DeviceARMVGICv3); err != nil {
		t.Fatal(err)
	}
	gic, err := vm.CreateDevice(DeviceARMVGICv3)
	if err != nil {
		t.Fatal(err)
	}
	defer gic.Close()
	dist, redist, nirqs := uint64(testGICDist), uint64(testGICRedist), uint64(testGICIRQs)
	for _, a := range []struct {
		group uint32
		attr  uint64
		val   *uint64
	}{{VGICGroupAddr, VGICV3AddrDist, &dist}, {VGICGroupAddr, VGICV3AddrRedist, &redist}, {VGICGroupNrIRQs, 0, &nirqs}, {VGICGroupCtrl, VGICCtrlInit, nil}} {
		if err := gic.SetAttr(a.group, a.attr, a.val); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := gic.GetAttr(VGICGroupAddr, VGICV3AddrDist); err != nil || got != testGICDist {
		t.Errorf("distributor at %#x, %v", got, err)
	}
	if got, err := gic.GetAttr(VGICGroupNrIRQs, 0); err != nil || got != testGICIRQs {
		t.Errorf("%d IRQs, %v", got, err)
	}
	if !gic.HasAttr(VGICGroupCtrl, VGICCtrlInit) || gic.HasAttr(VGICGroupCtrl, 99) {
		t.Error("HasAttr: CTRL_INIT missing or attribute 99 present")
	}
	if _, err := gic.GetAttr(VGICGroupDistRegs, VGICV3RegAttr(0, 0)); err != nil {
		t.Errorf("GICD_CTLR: %v", err)
	}
	if _, err := gic.GetAttr(VGICGroupRedistRegs, VGICV3RegAttr(0x8000_0000, 0)); err != nil {
		t.Errorf("vCPU 0's GICR_CTLR: %v", err)
	}
	for _, level := range []bool{true, false} {
		if err := vm.IRQLine(ARMIRQLineSPI(33), level); err != nil {
			t.Errorf("SPI INTID 33 level %v: %v", level, err)
		}
	}
	if err := vm.IRQLine(ARMIRQLineSPI(testGICIRQs+5), true); err == nil {
		t.Errorf("SPI INTID %d, beyond the GIC's %d, accepted", testGICIRQs+5, testGICIRQs)
	}
}
