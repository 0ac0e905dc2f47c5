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
		{Function: 0xd, Index: 5, Flags: sig, EAX: 0x40, EBX: 0x440},
		{Function: 0xd, Index: 6, Flags: sig, EAX: 0x200, EBX: 0x480},
		{Function: 0xd, Index: 7, Flags: sig, EAX: 0x400, EBX: 0x680},
		{Function: 0xd, Index: 9, Flags: sig, EAX: 0x8, EBX: 0xa80},
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
		{Function: 0xd, Index: 9, Flags: sig, EAX: 0x8, EBX: 0x980},
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

// withLeaf returns entries with leaf function.index edited by edit (added
// zeroed if absent, removed if edit is nil).
func withLeaf(entries []CPUIDEntry, function, index uint32, edit func(*CPUIDEntry)) []CPUIDEntry {
	out := slices.Clone(entries)
	i := slices.IndexFunc(out, func(e CPUIDEntry) bool { return e.Function == function && e.Index == index })
	switch {
	case edit == nil && i >= 0:
		return slices.Delete(out, i, i+1)
	case edit == nil:
		return out
	case i < 0:
		out = append(out, CPUIDEntry{Function: function, Index: index, Flags: sig})
		i = len(out) - 1
	}
	edit(&out[i])
	return out
}

// TestCPUIDISAExtensions is the policy's table over synthetic supported
// tables: the host's ISA extensions pass; AVX and what builds on it only
// with XSAVE and the XCR0 AVX state; AVX-512 only with its three XCR0
// states; what the policy deliberately hides stays hidden; leaf 0xD
// offers exactly the states of the offered features, in at most 4 KiB.
func TestCPUIDISAExtensions(t *testing.T) {
	const (
		// SSE3, PCLMULQDQ, SSSE3, CX16, SSE4.1, SSE4.2, MOVBE, POPCNT, AES, RDRAND.
		isa1   = 1<<0 | 1<<1 | 1<<9 | ecx1CX16 | 1<<19 | 1<<20 | 1<<22 | 1<<23 | 1<<25 | 1<<30
		avx1   = ecx1AVX | ecx1FMA | ecx1F16C
		isa7   = 1<<3 | 1<<8 | 1<<19 | 1<<29 // BMI1, BMI2, ADX, SHA
		avx512 = ebx7AVX512F | ebx7AVX512DQ | ebx7AVX512CD | ebx7AVX512BW | ebx7AVX512VL
	)
	base := intelSupported()
	noXSAVE := withLeaf(base, 1, 0, func(e *CPUIDEntry) { e.ECX &^= ecx1XSAVE })
	noYMM := withLeaf(base, 0xd, 0, func(e *CPUIDEntry) { e.EAX &^= uint32(xfeatureYMM) })
	noZMM := withLeaf(base, 0xd, 0, func(e *CPUIDEntry) { e.EAX &^= uint32(xfeatureHi16ZMM) })
	noZMMSubleaf := withLeaf(base, 0xd, 6, nil)
	noAVXBit := withLeaf(base, 1, 0, func(e *CPUIDEntry) { e.ECX &^= ecx1AVX })
	amx := withLeaf(base, 7, 0, func(e *CPUIDEntry) { e.EDX |= edx7AMXTile | edx7AMXInt8 | edx7AMXBF16 })
	amx = withLeaf(amx, 0xd, 0, func(e *CPUIDEntry) { e.EAX |= uint32(xfeatureAMX) })
	amx = withLeaf(amx, 0xd, 17, func(e *CPUIDEntry) { e.EAX, e.EBX = 0x40, 0xac0 })
	amx = withLeaf(amx, 0xd, 18, func(e *CPUIDEntry) { e.EAX, e.EBX = 0x2000, 0xb00 })
	amx = withLeaf(amx, 0x1d, 0, func(e *CPUIDEntry) { e.EAX = 1 })
	hugeYMM := withLeaf(base, 0xd, 2, func(e *CPUIDEntry) { e.EBX = 0xf80 }) // would end past 4 KiB

	for _, c := range []struct {
		name      string
		supported []CPUIDEntry
		avx       bool   // AVX, FMA, F16C, AVX2, VAES, VPCLMULQDQ, AVX-VNNI
		avx512    bool   // AVX-512 F/DQ/CD/BW/VL/VBMI/…, AVX512_BF16
		xcr0      uint32 // leaf 0xD.0 EAX
		size      uint32 // leaf 0xD.0 ECX
	}{
		{"host with AVX-512", base, true, true, 0x2e7, 0xa88},
		{"no XSAVE", noXSAVE, false, false, 0x3, 576},
		{"no XCR0 AVX state", noYMM, false, false, 0x203, 0xa88},
		{"no Hi16_ZMM state", noZMM, true, false, 0x207, 0xa88},
		{"no ZMM_Hi256 subleaf", noZMMSubleaf, true, false, 0x207, 0xa88},
		{"no AVX bit", noAVXBit, false, false, 0x203, 0xa88},
		{"AMX offered by KVM", amx, true, true, 0x2e7, 0xa88},
		{"AVX state past 4 KiB", hugeYMM, false, false, 0x203, 0xa88},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := mustCPUID(t, c.supported, CPUIDPolicy{CPUCount: 1})
			l1, l7, l71 := leaf(t, out, 1, 0), leaf(t, out, 7, 0), leaf(t, out, 7, 1)
			require.Equal(t, uint32(isa1), l1.ECX&isa1, "SSE3…SSE4.2, POPCNT, AES, PCLMULQDQ, MOVBE pass")
			require.Equal(t, uint32(isa7), l7.EBX&isa7, "BMI1, BMI2, ADX, SHA pass")
			require.NotZero(t, l7.ECX&(1<<8), "GFNI (legacy SSE encoding) passes")
			require.Zero(t, l1.ECX&ecx1OSXSAVE, "OSXSAVE is KVM's, from CR4")
			require.Equal(t, c.avx, l1.ECX&ecx1AVX != 0, "AVX")
			require.Equal(t, c.avx, l1.ECX&avx1 == avx1, "FMA, F16C with AVX")
			require.Equal(t, c.avx, l7.EBX&ebx7AVX2 != 0, "AVX2")
			require.Equal(t, c.avx, l7.ECX&(ecx7VAES|ecx7VPCLMULQDQ) == ecx7VAES|ecx7VPCLMULQDQ, "VAES, VPCLMULQDQ")
			require.Equal(t, c.avx, l71.EAX&eax71AVXVNNI != 0, "AVX-VNNI")
			require.Equal(t, c.avx512, l7.EBX&avx512 == avx512, "AVX-512")
			require.Equal(t, c.avx512, l7.ECX&ecx7AVX512VBMI != 0, "AVX-512 VBMI")
			require.Equal(t, c.avx512, l7.EDX&edx7AVX512FP16 != 0, "AVX-512 FP16")
			require.Equal(t, c.avx512, l71.EAX&eax71AVX512BF != 0, "AVX-512 BF16")
			if !c.avx {
				require.Zero(t, l7.EBX&avx512, "no AVX-512 without AVX")
			}
			// Deliberately hidden whatever the host has.
			require.Zero(t, l7.EBX&ebx7MPX, "MPX: its BNDREGS/BNDCSR states are not offered by this host")
			require.Zero(t, l7.EDX&(edx7AMXTile|edx7AMXInt8|edx7AMXBF16), "AMX: tile data does not fit kvm_xsave")
			require.False(t, hasLeaf(out, 0x1d), "AMX tile leaf removed")
			require.Zero(t, l7.EBX&(ebx7SGX|ebx7IntelPT))
			require.Zero(t, l1.ECX&(ecx1VMX|ecx1MONITOR|ecx1PDCM))
			require.Equal(t, c.xcr0 != 0x3, l1.ECX&ecx1XSAVE != 0, "XSAVE")
			require.Equal(t, c.xcr0 != 0x3, l7.ECX&ecx7PKU != 0, "PKU, with XSAVE and its PKRU state")

			d0 := leaf(t, out, 0xd, 0)
			require.Equal(t, c.xcr0, d0.EAX, "XCR0 states offered: %#x", d0.EAX)
			require.Zero(t, d0.EDX)
			require.Equal(t, c.size, d0.ECX, "XSAVE area of every offered state")
			require.LessOrEqual(t, d0.ECX, uint32(MaxXSAVEAreaSize))
			for _, e := range leavesOf(out, 0xd) {
				if e.Index >= 2 {
					require.NotZero(t, uint64(d0.EAX)&(1<<e.Index), "subleaf %d of a state not offered", e.Index)
				}
			}
		})
	}
}
