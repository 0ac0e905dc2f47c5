package x86

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func vendorRegs(v string) (ebx, edx, ecx uint32) {
	b := []byte(v)
	return binary.LittleEndian.Uint32(b[0:]), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:])
}

const sig = CPUIDFlagSignificantIndex

// intelSupported is a hand-written KVM_GET_SUPPORTED_CPUID table modelled
// on a modern Intel host (Ice Lake server class, 8 cores / 16 threads) as
// KVM reports it: the host's features, its cache and topology leaves, and
// things the policy must remove.
func intelSupported() []CPUIDEntry {
	ebx, edx, ecx := vendorRegs("GenuineIntel")
	return []CPUIDEntry{
		{Function: 0x0, EAX: 0x1f, EBX: ebx, ECX: ecx, EDX: edx},
		{Function: 0x1, EAX: 0x000606a6, EBX: 0x05100800,
			ECX: 1<<0 | 1<<1 | ecx1MONITOR | ecx1VMX | 1<<9 | ecx1FMA | ecx1CX16 | ecx1PDCM | 1<<17 |
				1<<19 | 1<<20 | 1<<21 | 1<<22 | 1<<23 | 1<<25 | ecx1XSAVE | ecx1OSXSAVE | ecx1AVX | ecx1F16C | 1<<30,
			EDX: 0x0f8bfbff | edx1DS | edx1ACPI | edx1HTT | edx1TM | edx1PBE},
		{Function: 0x4, Index: 0, Flags: sig, EAX: 0x1c004121, EBX: 0x02c0003f, ECX: 0x3f},
		{Function: 0x4, Index: 1, Flags: sig, EAX: 0x1c004122, EBX: 0x01c0003f, ECX: 0x3f},
		{Function: 0x4, Index: 2, Flags: sig, EAX: 0x1c004143, EBX: 0x04c0003f, ECX: 0x3ff},
		{Function: 0x4, Index: 3, Flags: sig, EAX: 0x1c03c163, EBX: 0x02c0003f, ECX: 0xbfff},
		{Function: 0x4, Index: 4, Flags: sig},
		{Function: 0x6, EAX: 0x000027f7, EBX: 0x2, ECX: 0x9},
		{Function: 0x7, Index: 0, Flags: sig, EAX: 1,
			EBX: 1<<0 | ebx7SGX | 1<<3 | ebx7AVX2 | 1<<8 | 1<<9 | ebx7MPX | ebx7AVX512F | ebx7AVX512DQ |
				1<<18 | 1<<19 | ebx7AVX512IF | ebx7IntelPT | ebx7AVX512CD | 1<<29 | ebx7AVX512BW | ebx7AVX512VL,
			ECX: ecx7AVX512VBMI | ecx7PKU | ecx7OSPKE | ecx7AVX512VBMI2 | 1<<8 | ecx7VAES | ecx7VPCLMULQDQ |
				ecx7AVX512VNNI | ecx7AVX512BALG | ecx7AVX512VPOPC | 1<<22 | ecx7SGXLC,
			EDX: 1<<4 | edx7AVX512VP2I | 1<<10 | edx7AVX512FP16 | 1<<26 | 1<<27 | edx7ArchCaps | 1<<31},
		{Function: 0x7, Index: 1, Flags: sig, EAX: eax71AVXVNNI | eax71AVX512BF | 1<<10},
		{Function: 0xa, EAX: 0x07300805, EBX: 0, ECX: 0, EDX: 0x603},
		{Function: 0xb, Index: 0, Flags: sig, EAX: 1, EBX: 2, ECX: 0x100, EDX: 3},
		{Function: 0xb, Index: 1, Flags: sig, EAX: 4, EBX: 16, ECX: 0x201, EDX: 3},
		{Function: 0xd, Index: 0, Flags: sig, EAX: 0x2e7, EBX: 0xa88, ECX: 0xa88},
		{Function: 0xd, Index: 1, Flags: sig, EAX: 0xf},
		{Function: 0xd, Index: 2, Flags: sig, EAX: 0x100, EBX: 0x240},
		{Function: 0x12, Index: 0, Flags: sig, EAX: 0x3},
		{Function: 0x14, Index: 0, Flags: sig, EAX: 0x1, EBX: 0xf},
		{Function: 0x1f, Index: 0, Flags: sig, EAX: 1, EBX: 2, ECX: 0x100, EDX: 3},
		{Function: 0x1f, Index: 1, Flags: sig, EAX: 4, EBX: 16, ECX: 0x201, EDX: 3},
		{Function: 0x40000000, EAX: 0x40000001, EBX: 0x4b4d564b, ECX: 0x564b4d56, EDX: 0x4d},
		{Function: 0x40000001, EAX: 0x01007afb, EDX: 0x1},
		{Function: 0x40000010, EAX: 0x1234}, // must not survive
		{Function: 0x80000000, EAX: 0x80000008},
		{Function: 0x80000001, ECX: 0x121 | ecxExtPerfCore, EDX: 0x2c100800},
		{Function: 0x80000007, EDX: 0x100 | 0x7},
		{Function: 0x80000008, EAX: 0x3027, EBX: 0x200},
	}
}

// amdSupported is modelled on a Zen 3 host (16 cores / 32 threads).
func amdSupported() []CPUIDEntry {
	ebx, edx, ecx := vendorRegs("AuthenticAMD")
	return []CPUIDEntry{
		{Function: 0x0, EAX: 0x10, EBX: ebx, ECX: ecx, EDX: edx},
		{Function: 0x1, EAX: 0x00a20f10, EBX: 0x0a200800,
			ECX: 0x7ed8320b | ecx1CX16 | ecx1XSAVE | ecx1AVX | ecx1MONITOR, EDX: 0x178bfbff},
		{Function: 0x6, EAX: 0x4, ECX: 0x1},
		{Function: 0x7, Index: 0, Flags: sig, EBX: 0x219c97a9 | ebx7AVX2, ECX: 0x0040068c | ecx7VAES | ecx7OSPKE, EDX: 0x10},
		{Function: 0xb, Index: 0, Flags: sig, EAX: 1, EBX: 2, ECX: 0x100, EDX: 0},
		{Function: 0xb, Index: 1, Flags: sig, EAX: 5, EBX: 32, ECX: 0x201, EDX: 0},
		{Function: 0xd, Index: 0, Flags: sig, EAX: 0x207, EBX: 0x988, ECX: 0x988},
		{Function: 0xd, Index: 1, Flags: sig, EAX: 0xf},
		{Function: 0xd, Index: 2, Flags: sig, EAX: 0x100, EBX: 0x240},
		{Function: 0x40000000, EAX: 0x40000001, EBX: 0x4b4d564b, ECX: 0x564b4d56, EDX: 0x4d},
		{Function: 0x40000001, EAX: 0x01007efb},
		{Function: 0x80000000, EAX: 0x80000022},
		{Function: 0x80000001, EAX: 0x00a20f10,
			ECX: ecxExtCmpLegacy | ecxExtSVM | 1<<5 | 1<<6 | 1<<8 | ecxExtXOP | ecxExtFMA4 | 1<<22 | ecxExtPerfCore | ecxExtPerfNB | ecxExtMONITORX,
			EDX: 0x2fd3fbff},
		{Function: 0x80000007, EDX: 0x6799},
		{Function: 0x80000008, EAX: 0x3030, EBX: 0x111ef657, ECX: 0x501f},
		{Function: 0x8000000a, EAX: 1, EBX: 0x8000, EDX: 0x101bbcff},
		{Function: 0x8000001d, Index: 0, Flags: sig, EAX: 0x4121, EBX: 0x1c0003f, ECX: 0x3f},
		{Function: 0x8000001d, Index: 1, Flags: sig, EAX: 0x4122, EBX: 0x1c0003f, ECX: 0x3f},
		{Function: 0x8000001d, Index: 2, Flags: sig, EAX: 0x4143, EBX: 0x1c0003f, ECX: 0x3ff},
		{Function: 0x8000001d, Index: 3, Flags: sig, EAX: 0x3c163, EBX: 0x3c0003f, ECX: 0x7fff},
		{Function: 0x8000001e, EAX: 0x5, EBX: 0x102, ECX: 0x3},
		{Function: 0x80000022, EAX: 0x1, EBX: 0x1234},
	}
}

func mustCPUID(t *testing.T, supported []CPUIDEntry, p CPUIDPolicy) []CPUIDEntry {
	t.Helper()
	out, err := CPUIDForVCPU(supported, p)
	require.NoError(t, err)
	require.True(t, slices.IsSortedFunc(out, func(a, b CPUIDEntry) int {
		if a.Function != b.Function {
			return int(int64(a.Function) - int64(b.Function))
		}
		return int(int64(a.Index) - int64(b.Index))
	}), "entries must be sorted")
	return out
}

func leaf(t *testing.T, entries []CPUIDEntry, function, index uint32) CPUIDEntry {
	t.Helper()
	e := findLeaf(entries, function, index)
	require.NotNil(t, e, "leaf %#x.%d missing", function, index)
	return *e
}

func hasLeaf(entries []CPUIDEntry, function uint32) bool {
	return slices.ContainsFunc(entries, func(e CPUIDEntry) bool { return e.Function == function })
}

func TestCPUIDCommonRules(t *testing.T) {
	for name, supported := range map[string][]CPUIDEntry{"intel": intelSupported(), "amd": amdSupported()} {
		t.Run(name, func(t *testing.T) {
			before := slices.Clone(supported)
			out := mustCPUID(t, supported, CPUIDPolicy{VCPUIndex: 0, CPUCount: 1})
			require.Equal(t, before, supported, "the supported table must not be modified")

			l1 := leaf(t, out, 1, 0)
			require.NotZero(t, l1.ECX&ecx1Hypervisor, "hypervisor bit")
			for name, bit := range map[string]uint32{"MONITOR": ecx1MONITOR, "VMX": ecx1VMX, "SMX": ecx1SMX,
				"EST": ecx1EST, "TM2": ecx1TM2, "PDCM": ecx1PDCM, "OSXSAVE": ecx1OSXSAVE, "TSC-deadline": ecx1TSCDeadline,
				"DTES64": ecx1DTES64, "DS-CPL": ecx1DSCPL} {
				require.Zero(t, l1.ECX&bit, "leaf 1 ECX %s must be off", name)
			}
			for name, bit := range map[string]uint32{"DS": edx1DS, "ACPI": edx1ACPI, "TM": edx1TM, "PBE": edx1PBE, "HTT": edx1HTT} {
				require.Zero(t, l1.EDX&bit, "leaf 1 EDX %s must be off with one vCPU", name)
			}
			require.Equal(t, uint32(8), (l1.EBX>>8)&0xff, "CLFLUSH 64 bytes")
			// Features not touched by the policy pass through.
			require.NotZero(t, l1.ECX&ecx1CX16, "CX16 kept without PVM")
			require.NotZero(t, l1.ECX&ecx1XSAVE, "XSAVE kept without PVM")
			require.NotZero(t, l1.ECX&ecx1AVX, "AVX kept without PVM")

			l6 := leaf(t, out, 6, 0)
			require.Equal(t, CPUIDEntry{Function: 6, EAX: eax6ARAT}, l6, "leaf 6: only ARAT")

			l7 := leaf(t, out, 7, 0)
			require.Zero(t, l7.EBX&(ebx7SGX|ebx7IntelPT))
			require.Zero(t, l7.ECX&(ecx7SGXLC|ecx7OSPKE))
			require.NotZero(t, l7.EBX&ebx7AVX2, "AVX2 kept without PVM")

			hv := leaf(t, out, 0x40000000, 0)
			require.Equal(t, uint32(0x40000001), hv.EAX)
			var s [12]byte
			binary.LittleEndian.PutUint32(s[0:], hv.EBX)
			binary.LittleEndian.PutUint32(s[4:], hv.ECX)
			binary.LittleEndian.PutUint32(s[8:], hv.EDX)
			require.Equal(t, KVMSignature, string(s[:]))
			require.Equal(t, findLeaf(supported, 0x40000001, 0).EAX, leaf(t, out, 0x40000001, 0).EAX, "KVM features as reported")
			require.Nil(t, findLeaf(out, 0x40000010, 0))

			for _, gone := range []uint32{0x12, 0x14} {
				require.False(t, hasLeaf(out, gone), "leaf %#x must be removed", gone)
			}
			if e := findLeaf(out, 0xa, 0); e != nil {
				require.Equal(t, CPUIDEntry{Function: 0xa}, *e, "no PMU")
			}
			ext1 := leaf(t, out, 0x80000001, 0)
			require.Zero(t, ext1.ECX&(ecxExtSVM|ecxExtMONITORX|ecxExtPerfCore|ecxExtPerfNB|ecxExtPerfLLC))
			require.Equal(t, CPUIDEntry{Function: 0x80000007, EDX: edxExtInvariantT}, leaf(t, out, 0x80000007, 0))
			// Leaf 0xD passes through without PVM.
			require.Equal(t, *findLeaf(supported, 0xd, 0), leaf(t, out, 0xd, 0))
			require.NotNil(t, findLeaf(out, 0xd, 2))
		})
	}
}

func TestCPUIDTSCDeadline(t *testing.T) {
	out := mustCPUID(t, intelSupported(), CPUIDPolicy{CPUCount: 1, TSCDeadlineTimer: true})
	require.NotZero(t, leaf(t, out, 1, 0).ECX&ecx1TSCDeadline)
	out = mustCPUID(t, intelSupported(), CPUIDPolicy{CPUCount: 1})
	require.Zero(t, leaf(t, out, 1, 0).ECX&ecx1TSCDeadline)
}

func TestCPUIDPVM(t *testing.T) {
	for name, supported := range map[string][]CPUIDEntry{"intel": intelSupported(), "amd": amdSupported()} {
		t.Run(name, func(t *testing.T) {
			out := mustCPUID(t, supported, CPUIDPolicy{CPUCount: 2, VCPUIndex: 1, PVM: true})
			l1 := leaf(t, out, 1, 0)
			for name, bit := range map[string]uint32{"CX16": ecx1CX16, "XSAVE": ecx1XSAVE, "OSXSAVE": ecx1OSXSAVE,
				"AVX": ecx1AVX, "FMA": ecx1FMA, "F16C": ecx1F16C} {
				require.Zero(t, l1.ECX&bit, "PVM: leaf 1 ECX %s must be off", name)
			}
			require.NotZero(t, l1.ECX&(1<<23), "POPCNT survives")
			l7 := leaf(t, out, 7, 0)
			require.Zero(t, l7.EBX&(ebx7AVX2|ebx7AVX512F|ebx7AVX512DQ|ebx7AVX512IF|ebx7AVX512CD|ebx7AVX512BW|ebx7AVX512VL|ebx7MPX))
			require.Zero(t, l7.ECX&(ecx7AVX512VBMI|ecx7PKU|ecx7AVX512VBMI2|ecx7VAES|ecx7VPCLMULQDQ|ecx7AVX512VNNI|ecx7AVX512BALG|ecx7AVX512VPOPC))
			require.Zero(t, l7.EDX&(edx7AVX512VP2I|edx7AVX512FP16|edx7ArchCaps), "ARCH_CAPABILITIES (MSR 0x10a) off under PVM")
			if e := findLeaf(out, 7, 1); e != nil {
				require.Zero(t, e.EAX&(eax71AVXVNNI|eax71AVX512BF))
			}
			require.Equal(t, []CPUIDEntry{
				{Function: 0xd, Index: 0, Flags: sig, EAX: 3, EBX: 576, ECX: 576},
				{Function: 0xd, Index: 1, Flags: sig},
			}, leavesOf(out, 0xd), "leaf 0xD trimmed to x87+SSE")
			ext1 := leaf(t, out, 0x80000001, 0)
			require.Zero(t, ext1.ECX&(ecxExtXOP|ecxExtFMA4|ecxExtLWP))
		})
	}
}

func leavesOf(entries []CPUIDEntry, function uint32) []CPUIDEntry {
	var out []CPUIDEntry
	for _, e := range entries {
		if e.Function == function {
			out = append(out, e)
		}
	}
	return out
}

func TestCPUIDTopology(t *testing.T) {
	for _, count := range []int{1, 2, 4, 3, 254} {
		wantShift := map[int]uint32{1: 0, 2: 1, 3: 2, 4: 2, 254: 8}[count]
		for _, idx := range []int{0, count - 1} {
			t.Run(fmt.Sprintf("intel-%dcpus-vcpu%d", count, idx), func(t *testing.T) {
				out := mustCPUID(t, intelSupported(), CPUIDPolicy{VCPUIndex: idx, CPUCount: count})
				l1 := leaf(t, out, 1, 0)
				require.Equal(t, uint32(idx), l1.EBX>>24, "APIC ID")
				require.Equal(t, uint32(count), (l1.EBX>>16)&0xff, "logical processors")
				require.Equal(t, count > 1, l1.EDX&edx1HTT != 0, "HTT")
				for _, topo := range []uint32{0xb, 0x1f} {
					require.Equal(t, []CPUIDEntry{
						{Function: topo, Index: 0, Flags: sig, EAX: 0, EBX: 1, ECX: 0x100, EDX: uint32(idx)},
						{Function: topo, Index: 1, Flags: sig, EAX: wantShift, EBX: uint32(count), ECX: 0x201, EDX: uint32(idx)},
						{Function: topo, Index: 2, Flags: sig, ECX: 2, EDX: uint32(idx)},
					}, leavesOf(out, topo))
				}
				for i := uint32(0); i < 4; i++ {
					eax := leaf(t, out, 4, i).EAX
					level := (eax >> 5) & 7
					sharing := (eax >> 14) & 0xfff
					if level < 3 {
						require.Zero(t, sharing, "L%d is per core", level)
					} else {
						require.Equal(t, uint32(count-1), sharing, "L3 shared by all")
					}
					require.Equal(t, min(uint32(count-1), 63), eax>>26, "cores per package (6 bits, saturated)")
					require.Equal(t, findLeaf(intelSupported(), 4, i).EAX&0x3fff, eax&0x3fff, "cache type/level kept")
				}
				require.Equal(t, uint32(0x200), leaf(t, out, 0x80000008, 0).EBX, "Intel leaf 0x80000008 untouched")
				require.Zero(t, leaf(t, out, 0x80000008, 0).ECX)
			})
			t.Run(fmt.Sprintf("amd-%dcpus-vcpu%d", count, idx), func(t *testing.T) {
				out := mustCPUID(t, amdSupported(), CPUIDPolicy{VCPUIndex: idx, CPUCount: count})
				l1 := leaf(t, out, 1, 0)
				require.Equal(t, uint32(idx), l1.EBX>>24)
				require.Equal(t, count > 1, l1.EDX&edx1HTT != 0)
				require.Equal(t, count > 1, leaf(t, out, 0x80000001, 0).ECX&ecxExtCmpLegacy != 0, "CmpLegacy")
				ecx := leaf(t, out, 0x80000008, 0).ECX
				require.Equal(t, uint32(count-1), ecx&0xff, "NC")
				if count > 1 {
					require.Equal(t, wantShift, (ecx>>12)&0xf, "ApicIdCoreIdSize")
				}
				require.Equal(t, CPUIDEntry{Function: 0x8000001e, EAX: uint32(idx), EBX: uint32(idx)}, leaf(t, out, 0x8000001e, 0))
				l3 := leaf(t, out, 0x8000001d, 3)
				require.Equal(t, uint32(count-1), (l3.EAX>>14)&0xfff)
				require.Zero(t, (leaf(t, out, 0x8000001d, 0).EAX>>14)&0xfff)
				require.Equal(t, CPUIDEntry{Function: 0x8000000a}, leaf(t, out, 0x8000000a, 0), "no nested SVM")
				require.Equal(t, CPUIDEntry{Function: 0x80000022}, leaf(t, out, 0x80000022, 0), "no PMU v2")
			})
		}
	}
}

func TestCPUIDNoTopologyLeafOnOldHost(t *testing.T) {
	var supported []CPUIDEntry
	for _, e := range intelSupported() {
		if e.Function != 0xb && e.Function != 0x1f {
			supported = append(supported, e)
		}
	}
	out := mustCPUID(t, supported, CPUIDPolicy{CPUCount: 2})
	require.False(t, hasLeaf(out, 0xb), "no leaf 0xB invented beyond the host's max leaf")
	require.False(t, hasLeaf(out, 0x1f))
}

func TestCPUIDRejects(t *testing.T) {
	good := intelSupported()
	noVendor := slices.DeleteFunc(intelSupported(), func(e CPUIDEntry) bool { return e.Function == 0 })
	noFeatures := slices.DeleteFunc(intelSupported(), func(e CPUIDEntry) bool { return e.Function == 1 })
	huge := make([]CPUIDEntry, MaxCPUIDEntries+1)
	copy(huge, good)
	for name, tc := range map[string]struct {
		supported []CPUIDEntry
		p         CPUIDPolicy
	}{
		"zero CPUs":       {good, CPUIDPolicy{CPUCount: 0}},
		"too many CPUs":   {good, CPUIDPolicy{CPUCount: MaxCPUs + 1}},
		"negative index":  {good, CPUIDPolicy{CPUCount: 2, VCPUIndex: -1}},
		"index too large": {good, CPUIDPolicy{CPUCount: 2, VCPUIndex: 2}},
		"no leaf 0":       {noVendor, CPUIDPolicy{CPUCount: 1}},
		"no leaf 1":       {noFeatures, CPUIDPolicy{CPUCount: 1}},
		"empty":           {nil, CPUIDPolicy{CPUCount: 1}},
		"too many leaves": {huge, CPUIDPolicy{CPUCount: 1}},
	} {
		_, err := CPUIDForVCPU(tc.supported, tc.p)
		require.ErrorIs(t, err, ErrBadCPUIDPolicy, name)
	}
}
