package kvm

import (
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOpenErrorsNameTheFix(t *testing.T) {
	err := openErrorFor("amd64", "/dev/kvm", unix.ENOENT)
	if !errors.Is(err, ErrNoKVM) || !strings.Contains(err.Error(), "modprobe kvm_intel") ||
		!strings.Contains(err.Error(), "BIOS") {
		t.Errorf("ENOENT: %v", err)
	}
	err = openErrorFor("amd64", "/dev/kvm", unix.EACCES)
	if !errors.Is(err, ErrKVMPermission) || !strings.Contains(err.Error(), "usermod -aG kvm") ||
		!strings.Contains(err.Error(), `KERNEL=="kvm", GROUP="kvm", MODE="0660"`) {
		t.Errorf("EACCES: %v", err)
	}
	err = openErrorFor("amd64", "/dev/kvm", unix.EIO)
	if errors.Is(err, ErrNoKVM) || errors.Is(err, ErrKVMPermission) || !errors.Is(err, unix.EIO) {
		t.Errorf("EIO: %v", err)
	}
}

// On arm64 KVM is built in and needs the kernel at EL2: no module to load.
func TestOpenErrorsNameTheFixOnARM64(t *testing.T) {
	err := openErrorFor("arm64", "/dev/kvm", unix.ENOENT)
	if !errors.Is(err, ErrNoKVM) || !strings.Contains(err.Error(), "EL2") || strings.Contains(err.Error(), "kvm_intel") {
		t.Errorf("ENOENT: %v", err)
	}
	err = openErrorFor("arm64", "/dev/kvm", unix.EACCES)
	if !errors.Is(err, ErrKVMPermission) || !strings.Contains(err.Error(), "usermod -aG kvm") {
		t.Errorf("EACCES: %v", err)
	}
}

func TestOpenPathMissingDevice(t *testing.T) {
	_, err := OpenPath(t.TempDir() + "/kvm")
	if !errors.Is(err, ErrNoKVM) {
		t.Fatalf("want ErrNoKVM, got %v", err)
	}
}

func TestOpenPathNotKVM(t *testing.T) {
	// /dev/null answers ioctls with ENOTTY: the error must say which ioctl failed.
	_, err := OpenPath("/dev/null")
	if err == nil || !strings.Contains(err.Error(), "KVM_GET_API_VERSION") {
		t.Fatalf("want a KVM_GET_API_VERSION error, got %v", err)
	}
}

func TestMissingCapabilitiesNamesEachOne(t *testing.T) {
	present := map[Capability]int{CapIRQChip: 1, CapPIT2: 1}
	err := missingCapabilities([]Capability{CapIRQChip, CapIRQFD, CapPIT2, CapImmediateExit},
		func(c Capability) (int, error) { return present[c], nil })
	if err == nil {
		t.Fatal("no error with capabilities missing")
	}
	for _, want := range []string{"KVM_CAP_IRQFD", "KVM_CAP_IMMEDIATE_EXIT"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "KVM_CAP_IRQCHIP") {
		t.Errorf("error %q names a present capability", err)
	}
	if err := missingCapabilities([]Capability{CapIRQChip},
		func(Capability) (int, error) { return 1, nil }); err != nil {
		t.Errorf("all present: %v", err)
	}
	if err := missingCapabilities([]Capability{CapIRQChip},
		func(Capability) (int, error) { return 0, unix.EBADF }); !errors.Is(err, unix.EBADF) {
		t.Errorf("check failure not wrapped: %v", err)
	}
}

func TestCapabilityAndExitNames(t *testing.T) {
	if CapImmediateExit.String() != "KVM_CAP_IMMEDIATE_EXIT" || Capability(9999).String() != "KVM_CAP_9999" {
		t.Error("capability names")
	}
	if ExitMMIO.String() != "KVM_EXIT_MMIO" || ExitReason(77).String() != "KVM_EXIT_77" {
		t.Error("exit names")
	}
}

func TestDetectPVM(t *testing.T) {
	const vmx = "processor\t: 0\nflags\t\t: fpu vme de pse vmx sse\n"
	const none = "processor\t: 0\nflags\t\t: fpu vme de pse hypervisor sse\n"
	if pvm, why := detectPVM("amd64", true, vmx); !pvm || !strings.Contains(why, "kvm_pvm") {
		t.Errorf("module loaded: %v %q", pvm, why)
	}
	if pvm, _ := detectPVM("amd64", false, vmx); pvm {
		t.Error("vmx host detected as PVM")
	}
	if pvm, _ := detectPVM("amd64", false, strings.Replace(vmx, "vmx", "svm", 1)); pvm {
		t.Error("svm host detected as PVM")
	}
	if pvm, why := detectPVM("amd64", false, none); !pvm || !strings.Contains(why, "neither vmx nor svm") {
		t.Errorf("no vmx/svm: %v %q", pvm, why)
	}
}

// An arm64 CPU shows no vmx or svm (its cpuinfo has Features, not flags),
// which on amd64 marks PVM; on arm64 it must not.
func TestDetectPVMNeverOnARM64(t *testing.T) {
	const arm64CPUInfo = "processor\t: 0\nBogoMIPS\t: 48.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics cpuid\nCPU implementer\t: 0x41\n"
	if pvm, why := detectPVM("arm64", false, arm64CPUInfo); pvm {
		t.Errorf("arm64 host taken for PVM: %s", why)
	}
	if pvm, why := detectPVM("arm64", true, arm64CPUInfo); pvm {
		t.Errorf("arm64 host with a kvm_pvm directory taken for PVM: %s", why)
	}
}

func TestLAPICRegisterAccess(t *testing.T) {
	var s LAPICState
	s.SetRegister(0x350, 0x700)
	if got := binary.LittleEndian.Uint32(s.Regs[0x350:]); got != 0x700 || s.Register(0x350) != 0x700 {
		t.Fatalf("register 0x350 = %#x", got)
	}
	s.SetRegister(1022, 1) // out of range: ignored, no panic
	if s.Register(1022) != 0 || s.Register(-4) != 0 {
		t.Fatal("out-of-range register read non-zero")
	}
}

func TestExitDecodingValidatesKernelData(t *testing.T) {
	c := &VCPU{run: make([]byte, 4096)}
	u := c.run[runOffUnion:]
	// IO: out, size 1, port 0x3f8, count 3, data at 0x1000 (past the area).
	u[0], u[1] = IODirectionOut, 1
	binary.LittleEndian.PutUint16(u[2:], 0x3f8)
	binary.LittleEndian.PutUint32(u[4:], 3)
	binary.LittleEndian.PutUint64(u[8:], 0x1000)
	if _, err := c.IO(); err == nil {
		t.Error("IO data outside kvm_run accepted")
	}
	binary.LittleEndian.PutUint64(u[8:], 0x800)
	copy(c.run[0x800:], "abc")
	io, err := c.IO()
	if err != nil || string(io.Data) != "abc" || io.Port != 0x3f8 || !io.Out || io.Count != 3 {
		t.Errorf("IO = %+v, %v", io, err)
	}
	u[1] = 3
	if _, err := c.IO(); err == nil {
		t.Error("IO size 3 accepted")
	}
	// MMIO: length 9 is invalid, 4 valid.
	binary.LittleEndian.PutUint64(u[0:], 0xd000_0000)
	binary.LittleEndian.PutUint32(u[16:], 9)
	if _, err := c.MMIO(); err == nil {
		t.Error("MMIO length 9 accepted")
	}
	binary.LittleEndian.PutUint32(u[16:], 4)
	u[20] = 1
	m, err := c.MMIO()
	if err != nil || m.Addr != 0xd000_0000 || !m.Write || len(m.Data) != 4 {
		t.Errorf("MMIO = %+v, %v", m, err)
	}
	// Internal error: emulation failure with instruction bytes.
	for i := range u[:64] {
		u[i] = 0
	}
	binary.LittleEndian.PutUint32(u[0:], InternalErrorEmulation)
	binary.LittleEndian.PutUint32(u[4:], 3)
	binary.LittleEndian.PutUint64(u[8:], emulationFlagInstructionBytes)
	u[16] = 2
	u[17], u[18] = 0xcc, 0x90
	ie := c.Internal()
	if ie.Suberror != 1 || len(ie.Data) != 3 || string(ie.Instruction) != "\xcc\x90" {
		t.Errorf("Internal = %+v", ie)
	}
	binary.LittleEndian.PutUint32(u[4:], 1000) // absurd ndata is capped
	if ie := c.Internal(); len(ie.Data) != 16 {
		t.Errorf("ndata not capped: %d", len(ie.Data))
	}
}

// openForTest opens /dev/kvm or skips the test, saying why.
func openForTest(t *testing.T) *System {
	t.Helper()
	if err := ProbeHost(DevicePath).Usable(); err != nil {
		t.Skipf("needs a usable %s (%v); runs in the nested KVM harness", DevicePath, err)
	}
	s, err := Open()
	if err != nil {
		t.Skipf("KVM not usable here: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestKVMSystemVMAndVCPU(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("x86 ioctls; on %s see TestARM64KVM…", runtime.GOARCH)
	}
	s := openForTest(t)
	cpuid, err := s.GetSupportedCPUID()
	if err != nil || len(cpuid) == 0 {
		t.Fatalf("GetSupportedCPUID: %d entries, %v", len(cpuid), err)
	}
	vm, err := s.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	if err := vm.SetTSSAddr(0xfffb_d000); err != nil {
		t.Fatal(err)
	}
	if err := vm.SetIdentityMapAddr(0xfffb_c000); err != nil {
		t.Fatal(err)
	}
	if err := vm.CreateIRQChip(); err != nil {
		t.Fatal(err)
	}
	if err := vm.CreatePIT2(); err != nil {
		t.Fatal(err)
	}
	c, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetCPUID2(cpuid); err != nil {
		t.Fatal(err)
	}
	regs, err := c.GetRegs()
	if err != nil {
		t.Fatal(err)
	}
	regs.RAX, regs.RIP = 0x1234, 0x1000
	if err := c.SetRegs(regs); err != nil {
		t.Fatal(err)
	}
	back, err := c.GetRegs()
	if err != nil || back.RAX != 0x1234 || back.RIP != 0x1000 {
		t.Fatalf("regs round trip: %+v %v", back, err)
	}
	sregs, err := c.GetSregs()
	if err != nil {
		t.Fatal(err)
	}
	if sregs.CS.Selector != 0xf000 {
		t.Errorf("reset CS selector %#x, want 0xf000", sregs.CS.Selector)
	}
	if err := c.SetSregs(sregs); err != nil {
		t.Fatal(err)
	}
	if err := c.SetMSRs([]MSR{{Index: 0x174, Data: 0x10}}); err != nil { // IA32_SYSENTER_CS
		t.Fatal(err)
	}
	got, err := c.GetMSRs([]uint32{0x174})
	if err != nil || len(got) != 1 || got[0].Data != 0x10 {
		t.Fatalf("GetMSRs: %+v %v", got, err)
	}
	lapic, err := c.GetLAPIC()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetLAPIC(lapic); err != nil {
		t.Fatal(err)
	}
	st, err := c.GetMPState()
	if err != nil || st != MPStateRunnable {
		t.Fatalf("BSP MP state %d, %v", st, err)
	}
	c.RequestImmediateExit(true)
	if err := c.Run(); !errors.Is(err, unix.EINTR) {
		t.Fatalf("Run with immediate_exit: %v, want EINTR", err)
	}
	counters, err := c.Counters()
	if err != nil {
		t.Fatalf("Counters: %v", err)
	}
	for _, name := range []string{"exits", "io_exits", "irq_injections", "halt_exits"} {
		if _, ok := counters[name]; !ok {
			t.Errorf("Counters has no %q: %v", name, counters)
		}
	}
}
