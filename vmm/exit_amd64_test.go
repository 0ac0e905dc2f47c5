package vmm

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

func TestCodeAroundReadsThroughThePageTables(t *testing.T) {
	m, err := NewMemory([]MemoryRegion{{0, 1 << 22}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	put := func(gpa, v uint64) {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		if err := m.WriteAt(b[:], gpa); err != nil {
			t.Fatal(err)
		}
	}
	// PML4 at 0x1000; entry 511 -> PDPT 0x2000; PDPT[510] -> PD 0x3000;
	// PD[0] -> 2 MiB page at 0x200000 (the walk itself: x86.Paging.Translate).
	put(0x1000+511*8, 0x2000|3)
	put(0x2000+510*8, 0x3000|3)
	put(0x3000, 0x200000|0x83)
	if err := m.WriteAt([]byte{1, 2, 3, 4}, 0x200100); err != nil {
		t.Fatal(err)
	}
	s := kvm.Sregs{CR0: x86.CR0Paging | 1, CR4: x86.CR4PAE, EFER: x86.LongModeEFER, CR3: 0x1000}
	s.CS.L = 1
	code, before := codeAround(m, kvm.Regs{RIP: 0xffffffff80000102}, s, 2, 2)
	if before != 2 || string(code) != "\x01\x02\x03\x04" {
		t.Errorf("codeAround = % x, %d", code, before)
	}
	// Without paging, RIP is CS.Base-relative and physical.
	code, before = codeAround(m, kvm.Regs{RIP: 0x100}, kvm.Sregs{CS: kvm.Segment{Base: 0x200000}}, 0, 4)
	if before != 0 || string(code) != "\x01\x02\x03\x04" {
		t.Errorf("codeAround without paging = % x, %d", code, before)
	}
	// RIP outside the tables: no code.
	if code, _ := codeAround(m, kvm.Regs{RIP: 0x1000}, s, 2, 2); code != nil {
		t.Errorf("unmapped RIP gave code % x", code)
	}
}

func TestLinuxCPUIDConvertsThroughTheX86Policy(t *testing.T) {
	supported := []kvm.CPUIDEntry{
		{Function: 0, EAX: 0xd, EBX: 0x756e6547, EDX: 0x49656e69, ECX: 0x6c65746e}, // GenuineIntel
		{Function: 1, EBX: 0xff00_0800, ECX: 1<<13 | 1<<26 | 1},                    // CX16, XSAVE, SSE3
	}
	orig := append([]kvm.CPUIDEntry(nil), supported...)
	out, err := LinuxCPUID(supported, CPUIDContext{CPU: 3, CPUs: 4})
	if err != nil {
		t.Fatal(err)
	}
	leaf1 := func(entries []kvm.CPUIDEntry) kvm.CPUIDEntry {
		for _, e := range entries {
			if e.Function == 1 {
				return e
			}
		}
		t.Fatal("no leaf 1")
		return kvm.CPUIDEntry{}
	}
	if e := leaf1(out); e.EBX>>24 != 3 || e.ECX&(1<<13) == 0 {
		t.Errorf("real KVM leaf 1: %+v", e)
	}
	out, err = LinuxCPUID(supported, CPUIDContext{CPU: 0, CPUs: 1, PVM: true})
	if err != nil {
		t.Fatal(err)
	}
	if e := leaf1(out); e.ECX&(1<<13|1<<26) != 0 {
		t.Errorf("PVM leaf 1 still offers CX16/XSAVE: %+v", e)
	}
	for i := range orig {
		if supported[i] != orig[i] {
			t.Error("policy modified its input")
		}
	}
}

func TestApplySystemRegistersKeepsKVMOwnedFields(t *testing.T) {
	s := kvm.Sregs{APICBase: 0xfee00900, CR2: 7, CR8: 1}
	b := x86.LongModeSystemRegisters(x86.PML4Addr)
	applySystemRegisters(&s, b)
	if s.CR3 != x86.PML4Addr || s.CR0 != b.CR0 || s.EFER != b.EFER || s.CS.L != 1 || s.CS.Selector != b.CS.Selector ||
		s.GDT.Base != b.GDT.Base || s.TR.Type != b.TR.Type {
		t.Errorf("boot fields not applied: %+v", s)
	}
	if s.APICBase != 0xfee00900 || s.CR2 != 7 || s.CR8 != 1 {
		t.Errorf("KVM-owned fields changed: %+v", s)
	}
	if r := kvm.Regs(x86.LinuxBootRegisters(0x1000000)); r.RIP != 0x1000000 || r.RSI != x86.ZeroPageAddr {
		t.Errorf("register conversion: %+v", r)
	}
}

func TestCPUInfoTSCKnown(t *testing.T) {
	if cpuinfoTSCKnown("processor\t: 0\ncpu MHz\t\t: 0.000\nflags\t: tsc\n") {
		t.Error("cpu MHz 0 taken as known")
	}
	if !cpuinfoTSCKnown("processor\t: 0\ncpu MHz\t\t: 2994.374\n") || !cpuinfoTSCKnown("") {
		t.Error("a calibrated or unknown host taken as uncalibrated")
	}
}

func TestInternalErrorIsPrintedLikeQemu(t *testing.T) {
	r := kvm.Regs{RIP: 0xffffffff81000123, RAX: 0x1234, RFLAGS: 0x46}
	s := kvm.Sregs{CR0: 0x80050033, EFER: 0xd01}
	s.CS.Selector = 0x10
	out := formatInternalError(kvm.InternalError{
		Suberror:    kvm.InternalErrorEmulation,
		Data:        []uint64{1, 0x30f, 0xc70f48},
		Instruction: []byte{0x48, 0x0f, 0xc7},
	}, formatRegisters(r, s, []byte{0x90, 0xcc, 0xf4}, 1))
	for _, want := range []string{
		"KVM internal error. Suberror: 1\n",
		"extra data[0]: 0x0000000000000001\n",
		"extra data[2]: 0x0000000000c70f48\n",
		"emulation failure\n",
		"Instruction bytes: 48 0f c7\n",
		"RAX=0000000000001234 ",
		"RIP=ffffffff81000123 RFL=00000046\n",
		"CS =0010 ",
		"EFER=0000000000000d01",
		"Code=90 <cc> f4\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
