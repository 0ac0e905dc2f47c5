package x86

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
)

// CPUIDEntry is one CPUID leaf (Function) and subleaf (Index) as KVM's
// struct kvm_cpuid_entry2 holds it.
type CPUIDEntry struct {
	Function, Index, Flags uint32
	EAX, EBX, ECX, EDX     uint32
}

// CPUIDFlagSignificantIndex is KVM_CPUID_FLAG_SIGNIFCANT_INDEX: the entry
// applies only to its Index (subleaf).
const CPUIDFlagSignificantIndex uint32 = 1

// MaxCPUs is the most vCPUs the layout supports: APIC IDs 0..MaxCPUs-1 plus
// the IOAPIC's ID (MaxCPUs) must fit in 8 bits below the broadcast ID 0xff.
const MaxCPUs = 254

// MaxCPUIDEntries bounds the supported table CPUIDForVCPU accepts
// (KVM_MAX_CPUID_ENTRIES is 256).
const MaxCPUIDEntries = 256

// KVMSignature is the hypervisor vendor at leaf 0x40000000 in EBX, ECX,
// EDX.
const KVMSignature = "KVMKVMKVM\x00\x00\x00"

// CPUID leaves the policy touches.
const (
	leafVendor          uint32 = 0x0
	leafFeatures        uint32 = 0x1
	leafCacheParams     uint32 = 0x4
	leafPower           uint32 = 0x6
	leafExtFeatures     uint32 = 0x7
	leafPerfMon         uint32 = 0xa
	leafTopology        uint32 = 0xb
	leafXSave           uint32 = 0xd
	leafSGX             uint32 = 0x12
	leafProcessorTrace  uint32 = 0x14
	leafTopologyV2      uint32 = 0x1f
	leafHypervisor      uint32 = 0x40000000
	leafKVMFeatures     uint32 = 0x40000001
	leafExtFeatures1    uint32 = 0x80000001
	leafAdvPowerMgmt    uint32 = 0x80000007
	leafAddressSizes    uint32 = 0x80000008
	leafSVM             uint32 = 0x8000000a
	leafAMDCacheTopo    uint32 = 0x8000001d
	leafAMDExtAPICID    uint32 = 0x8000001e
	leafAMDPerfMonV2    uint32 = 0x80000022
	hypervisorLeafFirst uint32 = 0x40000000
	hypervisorLeafLast  uint32 = 0x4fffffff
)

// Feature bits, named after Linux's cpufeatures.h.
const (
	// Leaf 1 ECX.
	ecx1DTES64      = 1 << 2
	ecx1MONITOR     = 1 << 3
	ecx1DSCPL       = 1 << 4
	ecx1VMX         = 1 << 5
	ecx1SMX         = 1 << 6
	ecx1EST         = 1 << 7
	ecx1TM2         = 1 << 8
	ecx1FMA         = 1 << 12
	ecx1CX16        = 1 << 13
	ecx1PDCM        = 1 << 15
	ecx1TSCDeadline = 1 << 24
	ecx1XSAVE       = 1 << 26
	ecx1OSXSAVE     = 1 << 27
	ecx1AVX         = 1 << 28
	ecx1F16C        = 1 << 29
	ecx1Hypervisor  = 1 << 31
	// Leaf 1 EDX.
	edx1DS   = 1 << 21
	edx1ACPI = 1 << 22
	edx1HTT  = 1 << 28
	edx1TM   = 1 << 29
	edx1PBE  = 1 << 31
	// Leaf 6 EAX.
	eax6ARAT = 1 << 2
	// Leaf 7.0 EBX.
	ebx7SGX      = 1 << 2
	ebx7AVX2     = 1 << 5
	ebx7MPX      = 1 << 14
	ebx7AVX512F  = 1 << 16
	ebx7AVX512DQ = 1 << 17
	ebx7AVX512IF = 1 << 21
	ebx7IntelPT  = 1 << 25
	ebx7AVX512PF = 1 << 26
	ebx7AVX512ER = 1 << 27
	ebx7AVX512CD = 1 << 28
	ebx7AVX512BW = 1 << 30
	ebx7AVX512VL = 1 << 31
	// Leaf 7.0 ECX.
	ecx7AVX512VBMI  = 1 << 1
	ecx7PKU         = 1 << 3
	ecx7OSPKE       = 1 << 4
	ecx7AVX512VBMI2 = 1 << 6
	ecx7VAES        = 1 << 9
	ecx7VPCLMULQDQ  = 1 << 10
	ecx7AVX512VNNI  = 1 << 11
	ecx7AVX512BALG  = 1 << 12
	ecx7AVX512VPOPC = 1 << 14
	ecx7SGXLC       = 1 << 30
	// Leaf 7.0 EDX.
	edx7AVX5124VNNIW = 1 << 2
	edx7AVX5124FMAPS = 1 << 3
	edx7AVX512VP2I   = 1 << 8
	edx7AMXBF16      = 1 << 22
	edx7AVX512FP16   = 1 << 23
	edx7AMXTile      = 1 << 24
	edx7AMXInt8      = 1 << 25
	edx7ArchCaps     = 1 << 29
	// Leaf 7.1 EAX / EDX.
	eax71AVXVNNI   = 1 << 4
	eax71AVX512BF  = 1 << 5
	eax71AVXIFMA   = 1 << 23
	edx71AVXVNNII8 = 1 << 4
	edx71AVXNECVT  = 1 << 5
	edx71AVXVNNI16 = 1 << 10
	// Leaf 0x80000001 ECX.
	ecxExtCmpLegacy  = 1 << 1
	ecxExtSVM        = 1 << 2
	ecxExtXOP        = 1 << 11
	ecxExtLWP        = 1 << 15
	ecxExtFMA4       = 1 << 16
	ecxExtPerfCore   = 1 << 23
	ecxExtPerfNB     = 1 << 24
	ecxExtPerfLLC    = 1 << 28
	ecxExtMONITORX   = 1 << 29
	edxExtInvariantT = 1 << 8 // leaf 0x80000007 EDX
)

// xsaveLegacyAreaSize is the XSAVE area of x87 + SSE state alone (legacy
// region 512 bytes + header 64 bytes).
const xsaveLegacyAreaSize = 576

// CPUIDPolicy says what the guest CPU is.
type CPUIDPolicy struct {
	// VCPUIndex is this vCPU's index, 0 for the boot CPU. It is also its
	// APIC ID, so the VMM must create vCPU i with KVM id i (MPTable lists
	// APIC IDs 0..CPUCount-1).
	VCPUIndex int
	// CPUCount is the number of vCPUs, 1..MaxCPUs. The guest sees one
	// socket of CPUCount cores with one thread each.
	CPUCount int
	// PVM says the host KVM is kvm_pvm, whose instruction emulator runs
	// the guest kernel and cannot execute CMPXCHG16B, XSAVE/XRSTOR or read
	// IA32_ARCH_CAPABILITIES: the features that lead a kernel there are
	// hidden (see HOST-FACTS.md).
	PVM bool
	// TSCDeadlineTimer is KVM_CAP_TSC_DEADLINE_TIMER: KVM emulates the
	// LAPIC TSC-deadline mode but KVM_GET_SUPPORTED_CPUID does not report
	// it, so the VMM says whether to offer it.
	TSCDeadlineTimer bool
}

// ErrBadCPUIDPolicy is returned for a policy or supported table
// CPUIDForVCPU cannot work with.
var ErrBadCPUIDPolicy = errors.New("bad CPUID policy")

// CPUIDForVCPU builds the CPUID table for one vCPU (for KVM_SET_CPUID2)
// from KVM_GET_SUPPORTED_CPUID's table. The table is never passed through
// blindly; each rule below says why. Entries come out sorted by (Function,
// Index).
//
//   - Leaf 1: the hypervisor bit set (the guest then looks for the KVM
//     leaves and uses kvmclock and PV features); APIC ID in EBX[31:24] and
//     the logical processor count in EBX[23:16] with HTT when CPUCount > 1,
//     as the legacy topology enumeration wants; CLFLUSH line size defaulted
//     to 64 bytes; TSC-deadline only if the policy offers it; MONITOR/MWAIT
//     off (idle must HLT so KVM can deschedule the vCPU); VMX/SMX off (no
//     nested virtualisation offered); EST, TM, TM2, ACPI, PBE off (no power
//     or thermal management); DS, DTES64, DS-CPL, PDCM off (no PMU);
//     OSXSAVE clear (KVM derives it from the guest's CR4 at run time).
//   - Leaf 4: cache sharing fields rewritten for one-thread cores: L1/L2
//     shared by one thread, L3 by every vCPU; cores per package CPUCount.
//   - Leaf 6: only ARAT (the LAPIC timer always runs): no power management.
//   - Leaf 7: SGX, SGX launch control and Intel PT off (not offered);
//     OSPKE clear (derived from CR4 at run time).
//   - Leaf 0xA: zero, no PMU is offered.
//   - Leaves 0xB and 0x1F: x2APIC topology for one socket, CPUCount cores,
//     one thread per core: an SMT level of 1, a core level of CPUCount with
//     a shift of ceil(log2(CPUCount)), EDX the x2APIC ID.
//   - Leaves 0x12 and 0x14 (SGX, PT) removed.
//   - Leaves 0x40000000..: replaced by KVM's signature (max leaf
//     0x40000001) and the 0x40000001 features KVM reports.
//   - Leaf 0x80000001: SVM off (no nested virtualisation), MONITORX off,
//     core/NB/LLC performance counters off (no PMU); CmpLegacy on AMD set
//     only with several vCPUs.
//   - Leaf 0x80000007: only invariant TSC kept: no power management.
//   - Leaf 0x80000008 (AMD): ECX core count and APIC ID size for CPUCount.
//   - Leaf 0x8000000A (SVM) and 0x80000022 (AMD PMU v2): zero.
//   - Leaves 0x8000001D/0x8000001E (AMD): cache sharing as leaf 4, the
//     extended APIC ID, core ID = VCPUIndex, one node.
//   - Every other feature KVM reports passes: the host's ISA extensions
//     (SSE3, SSSE3, SSE4.1/4.2, POPCNT, AES, PCLMULQDQ, MOVBE, BMI1/2,
//     ADX, SHA, GFNI…) are what the guest's programs are built for.
//   - XSAVE (planXSAVE): features whose registers live in XSAVE state are
//     offered only with XSAVE and every XCR0 state they need, as KVM
//     supports it: AVX, FMA, F16C, AVX2, VAES, VPCLMULQDQ, AVX-VNNI, XOP,
//     FMA4 with the AVX state; AVX-512 with AVX and the opmask, ZMM_Hi256
//     and Hi16_ZMM states; MPX with BNDREGS/BNDCSR; PKU with PKRU. AMX is
//     never offered (8 KiB of tile data do not fit the 4 KiB kvm_xsave a
//     snapshot saves: MaxXSAVEAreaSize), nor is a state whose area would
//     end past 4 KiB; leaves 0x1D/0x1E (AMX) removed. Leaf 0xD lists only
//     the offered states (and their subleaves) and their area size, so the
//     guest's XCR0 and XSAVE area stay within what a snapshot holds.
//   - With PVM: CX16, XSAVE, and so every XSAVE-state feature above, off;
//     ARCH_CAPABILITIES off (PVM fails MSR 0x10a); leaf 0xD trimmed to
//     x87+SSE with no XSAVE extensions.
func CPUIDForVCPU(supported []CPUIDEntry, p CPUIDPolicy) ([]CPUIDEntry, error) {
	if p.CPUCount < 1 || p.CPUCount > MaxCPUs {
		return nil, fmt.Errorf("%w: %d vCPUs, want 1..%d", ErrBadCPUIDPolicy, p.CPUCount, MaxCPUs)
	}
	if p.VCPUIndex < 0 || p.VCPUIndex >= p.CPUCount {
		return nil, fmt.Errorf("%w: vCPU index %d outside 0..%d", ErrBadCPUIDPolicy, p.VCPUIndex, p.CPUCount-1)
	}
	if len(supported) > MaxCPUIDEntries {
		return nil, fmt.Errorf("%w: %d supported CPUID entries, more than KVM's %d", ErrBadCPUIDPolicy, len(supported), MaxCPUIDEntries)
	}
	vendor, ok := cpuVendor(supported)
	if !ok {
		return nil, fmt.Errorf("%w: supported CPUID has no leaf 0 (vendor)", ErrBadCPUIDPolicy)
	}
	if findLeaf(supported, leafFeatures, 0) == nil {
		return nil, fmt.Errorf("%w: supported CPUID has no leaf 1 (features)", ErrBadCPUIDPolicy)
	}
	t := topology{apicID: uint32(p.VCPUIndex), count: uint32(p.CPUCount)}
	t.coreShift = uint32(bits.Len32(t.count - 1))
	amd := vendor == "AuthenticAMD" || vendor == "HygonGenuine"

	xsave := planXSAVE(supported, p)
	out := make([]CPUIDEntry, 0, len(supported)+4)
	var kvmFeatures *CPUIDEntry
	sawTopology, sawTopologyV2 := false, false
	sawXSave := false
	for _, e := range supported {
		switch {
		case e.Function == leafKVMFeatures:
			kvmFeatures = &e
			continue
		case e.Function >= hypervisorLeafFirst && e.Function <= hypervisorLeafLast:
			continue
		case e.Function == leafSGX || e.Function == leafProcessorTrace ||
			e.Function == leafAMXTileInfo || e.Function == leafAMXTMULInfo:
			continue
		case e.Function == leafTopology:
			sawTopology = true
			continue
		case e.Function == leafTopologyV2:
			sawTopologyV2 = true
			continue
		case e.Function == leafXSave:
			sawXSave = true
			continue
		}
		applyLeafRules(&e, p, t, amd)
		xsave.hide(&e)
		out = append(out, e)
	}
	if sawTopology {
		out = append(out, topologyLeaf(leafTopology, t)...)
	}
	if sawTopologyV2 {
		out = append(out, topologyLeaf(leafTopologyV2, t)...)
	}
	if sawXSave {
		out = append(out, xsave.xsaveLeaves(supported)...)
	}
	out = append(out, hypervisorLeaf())
	features := CPUIDEntry{Function: leafKVMFeatures}
	if kvmFeatures != nil {
		features.EAX, features.EDX = kvmFeatures.EAX, kvmFeatures.EDX
	}
	out = append(out, features)
	if len(out) > MaxCPUIDEntries {
		return nil, fmt.Errorf("%w: the policy produced %d CPUID entries, more than KVM's %d", ErrBadCPUIDPolicy, len(out), MaxCPUIDEntries)
	}
	slices.SortStableFunc(out, func(a, b CPUIDEntry) int {
		return cmp.Or(cmp.Compare(a.Function, b.Function), cmp.Compare(a.Index, b.Index))
	})
	return out, nil
}

// topology is the guest's CPU topology as seen by one vCPU.
type topology struct {
	apicID    uint32
	count     uint32
	coreShift uint32 // bits of the APIC ID that number cores
}

func applyLeafRules(e *CPUIDEntry, p CPUIDPolicy, t topology, amd bool) {
	switch e.Function {
	case leafFeatures:
		e.EBX = e.EBX&0xff | t.apicID<<24 | (t.count&0xff)<<16 | e.EBX&0xff00
		if e.EBX&0xff00 == 0 {
			e.EBX |= 8 << 8 // CLFLUSH line size in 8-byte units: 64 bytes
		}
		e.ECX |= ecx1Hypervisor
		e.ECX &^= ecx1MONITOR | ecx1VMX | ecx1SMX | ecx1EST | ecx1TM2 |
			ecx1DTES64 | ecx1DSCPL | ecx1PDCM | ecx1OSXSAVE | ecx1TSCDeadline
		if p.TSCDeadlineTimer {
			e.ECX |= ecx1TSCDeadline
		}
		e.EDX &^= edx1DS | edx1ACPI | edx1TM | edx1PBE | edx1HTT
		if t.count > 1 {
			e.EDX |= edx1HTT
		}
		if p.PVM {
			e.ECX &^= ecx1CX16
		}
	case leafCacheParams, leafAMDCacheTopo:
		if e.EAX&0x1f == 0 { // no cache at this subleaf
			return
		}
		level := (e.EAX >> 5) & 7
		sharing := uint32(0)
		if level >= 3 {
			sharing = t.count - 1
		}
		if e.Function == leafCacheParams {
			e.EAX = e.EAX&0x3fff | (sharing&0xfff)<<14 | (min(t.count-1, 63))<<26
		} else {
			e.EAX = e.EAX&^(0xfff<<14) | (sharing&0xfff)<<14
		}
	case leafPower:
		e.EAX &= eax6ARAT
		e.EBX, e.ECX, e.EDX = 0, 0, 0
	case leafExtFeatures:
		if e.Index == 0 {
			e.EBX &^= ebx7SGX | ebx7IntelPT
			e.ECX &^= ecx7SGXLC | ecx7OSPKE
			if p.PVM {
				e.EDX &^= edx7ArchCaps
			}
		}
	case leafPerfMon, leafSVM, leafAMDPerfMonV2:
		e.EAX, e.EBX, e.ECX, e.EDX = 0, 0, 0, 0
	case leafExtFeatures1:
		e.ECX &^= ecxExtSVM | ecxExtMONITORX | ecxExtPerfCore | ecxExtPerfNB | ecxExtPerfLLC
		if amd {
			e.ECX &^= ecxExtCmpLegacy
			if t.count > 1 {
				e.ECX |= ecxExtCmpLegacy
			}
		}
	case leafAdvPowerMgmt:
		e.EAX, e.EBX, e.ECX = 0, 0, 0
		e.EDX &= edxExtInvariantT
	case leafAddressSizes:
		if amd {
			// NC = cores - 1 in [7:0], ApicIdCoreIdSize in [15:12].
			e.ECX = (t.count - 1) & 0xff
			if t.count > 1 {
				e.ECX |= t.coreShift << 12
			}
		}
	case leafAMDExtAPICID:
		e.EAX = t.apicID
		e.EBX = t.apicID & 0xff // compute unit ID; one thread per unit
		e.ECX = 0               // node 0, one node per processor
		e.EDX = 0
	}
}

// topologyLeaf returns the x2APIC topology subleaves of leaf 0xB or 0x1F.
func topologyLeaf(leaf uint32, t topology) []CPUIDEntry {
	const (
		levelSMT  = 1
		levelCore = 2
	)
	f := CPUIDFlagSignificantIndex
	return []CPUIDEntry{
		// SMT level: one thread, no APIC ID bits.
		{Function: leaf, Index: 0, Flags: f, EAX: 0, EBX: 1, ECX: levelSMT<<8 | 0, EDX: t.apicID},
		// Core level: CPUCount cores behind coreShift bits.
		{Function: leaf, Index: 1, Flags: f, EAX: t.coreShift, EBX: t.count, ECX: levelCore<<8 | 1, EDX: t.apicID},
		// End of the enumeration (level type 0).
		{Function: leaf, Index: 2, Flags: f, ECX: 2, EDX: t.apicID},
	}
}

// hypervisorLeaf returns leaf 0x40000000: max hypervisor leaf and the KVM
// signature, which Linux's KVM guest support looks for.
func hypervisorLeaf() CPUIDEntry {
	sig := []byte(KVMSignature)
	return CPUIDEntry{
		Function: leafHypervisor,
		EAX:      leafKVMFeatures,
		EBX:      binary.LittleEndian.Uint32(sig[0:4]),
		ECX:      binary.LittleEndian.Uint32(sig[4:8]),
		EDX:      binary.LittleEndian.Uint32(sig[8:12]),
	}
}

func findLeaf(entries []CPUIDEntry, function, index uint32) *CPUIDEntry {
	for i := range entries {
		if entries[i].Function == function && entries[i].Index == index {
			return &entries[i]
		}
	}
	return nil
}

// cpuVendor returns the vendor string of leaf 0 (EBX, EDX, ECX).
func cpuVendor(entries []CPUIDEntry) (string, bool) {
	e := findLeaf(entries, leafVendor, 0)
	if e == nil {
		return "", false
	}
	var b [12]byte
	binary.LittleEndian.PutUint32(b[0:], e.EBX)
	binary.LittleEndian.PutUint32(b[4:], e.EDX)
	binary.LittleEndian.PutUint32(b[8:], e.ECX)
	return string(b[:]), true
}
