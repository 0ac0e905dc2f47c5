package x86

// XSAVE state components: bit i of XCR0 (user) or IA32_XSS (supervisor),
// described by CPUID leaf 0xD subleaf i (Intel SDM vol. 1, 13.1–13.5).
const (
	xfeatureX87      uint64 = 1 << 0
	xfeatureSSE      uint64 = 1 << 1
	xfeatureYMM      uint64 = 1 << 2
	xfeatureBNDREGS  uint64 = 1 << 3
	xfeatureBNDCSR   uint64 = 1 << 4
	xfeatureOpmask   uint64 = 1 << 5
	xfeatureZMMHi256 uint64 = 1 << 6
	xfeatureHi16ZMM  uint64 = 1 << 7
	xfeaturePKRU     uint64 = 1 << 9
	xfeatureTileCfg  uint64 = 1 << 17
	xfeatureTileData uint64 = 1 << 18
	xfeatureLWP      uint64 = 1 << 62

	// xfeatureLegacy is the x87 and SSE state every x86-64 CPU has, saved
	// by FXSAVE as well.
	xfeatureLegacy = xfeatureX87 | xfeatureSSE
	xfeatureAVX512 = xfeatureOpmask | xfeatureZMMHi256 | xfeatureHi16ZMM
	xfeatureMPX    = xfeatureBNDREGS | xfeatureBNDCSR
	xfeatureAMX    = xfeatureTileCfg | xfeatureTileData
)

// MaxXSAVEAreaSize is the largest guest XSAVE area the policy allows:
// struct kvm_xsave is 4096 bytes and KVM_GET_XSAVE, with which the VMM
// saves a snapshot's FPU/SIMD state, copies no more. AVX-512's state ends
// at 2696 bytes; AMX's 8 KiB of tile data would not fit (and would be
// silently cut from a snapshot), so AMX is never offered.
const MaxXSAVEAreaSize = 4096

// More feature bits the XSAVE rules touch (leaf 7 subleaf 1).
const (
	eax71AMXFP16    = 1 << 21
	edx71AMXComplex = 1 << 8
	ecx1XSAVEFamily = ecx1XSAVE | ecx1OSXSAVE
	leafAMXTileInfo = 0x1d
	leafAMXTMULInfo = 0x1e
	xsaveSubleafMax = 63
)

// featureBits are CPUID feature bits in the leaves the XSAVE rules touch.
type featureBits struct {
	leaf1ECX, leaf7EBX, leaf7ECX, leaf7EDX, leaf71EAX, leaf71EDX, extECX uint32
}

// xsaveGate is a family of instructions whose registers live in XSAVE
// state components: the guest may use them only if the OS can enable those
// components in XCR0, so each is offered only with all of its components.
type xsaveGate struct {
	name       string
	components uint64
	features   featureBits
	// needs names another gate this one builds on (AVX-512 on AVX).
	needs string
	// needsLeaf1ECX is a leaf 1 ECX bit the family builds on: AVX2, FMA…
	// on AVX itself.
	needsLeaf1ECX uint32
}

// xsaveGates are the families the policy gates, in dependency order.
var xsaveGates = []xsaveGate{
	{name: "AVX", components: xfeatureLegacy | xfeatureYMM, needsLeaf1ECX: ecx1AVX, features: featureBits{
		// VEX-encoded: FMA and F16C too, and VAES/VPCLMULQDQ's VEX forms.
		leaf1ECX:  ecx1AVX | ecx1FMA | ecx1F16C,
		leaf7EBX:  ebx7AVX2,
		leaf7ECX:  ecx7VAES | ecx7VPCLMULQDQ,
		leaf71EAX: eax71AVXVNNI | eax71AVXIFMA,
		leaf71EDX: edx71AVXVNNII8 | edx71AVXNECVT | edx71AVXVNNI16,
		extECX:    ecxExtXOP | ecxExtFMA4,
	}},
	{name: "AVX-512", needs: "AVX", components: xfeatureLegacy | xfeatureYMM | xfeatureAVX512, features: featureBits{
		leaf7EBX: ebx7AVX512F | ebx7AVX512DQ | ebx7AVX512IF | ebx7AVX512PF | ebx7AVX512ER |
			ebx7AVX512CD | ebx7AVX512BW | ebx7AVX512VL,
		leaf7ECX:  ecx7AVX512VBMI | ecx7AVX512VBMI2 | ecx7AVX512VNNI | ecx7AVX512BALG | ecx7AVX512VPOPC,
		leaf7EDX:  edx7AVX5124VNNIW | edx7AVX5124FMAPS | edx7AVX512VP2I | edx7AVX512FP16,
		leaf71EAX: eax71AVX512BF,
	}},
	{name: "MPX", components: xfeatureMPX, features: featureBits{leaf7EBX: ebx7MPX}},
	{name: "PKU", components: xfeaturePKRU, features: featureBits{leaf7ECX: ecx7PKU}},
	{name: "LWP", components: xfeatureLWP, features: featureBits{extECX: ecxExtLWP}},
	// AMX: components never offered (MaxXSAVEAreaSize), so never offered.
	{name: "AMX", components: xfeatureAMX, features: featureBits{
		leaf7EDX: edx7AMXBF16 | edx7AMXTile | edx7AMXInt8, leaf71EAX: eax71AMXFP16, leaf71EDX: edx71AMXComplex,
	}},
}

// xsavePlan is what the XSAVE rules decided for a supported table.
type xsavePlan struct {
	// enabled: XSAVE is offered (leaf 1 ECX.XSAVE).
	enabled bool
	// xcr0 are the user state components offered (leaf 0xD.0 EDX:EAX).
	xcr0 uint64
	// hidden are the feature bits to clear.
	hidden featureBits
	// size is the XSAVE area of every offered component (leaf 0xD.0 ECX).
	size uint32
}

// planXSAVE decides which XSAVE state components and which instruction
// families the guest gets. XSAVE is offered only if KVM supports it and
// its x87+SSE components and PVM does not forbid it; a component only if
// KVM supports it, its leaf 0xD subleaf places it, and the area with it
// fits MaxXSAVEAreaSize; a gated family only with all its components and
// the family it builds on, and its components only with it.
func planXSAVE(supported []CPUIDEntry, p CPUIDPolicy) xsavePlan {
	plan := xsavePlan{xcr0: xfeatureLegacy, size: xsaveLegacyAreaSize}
	l1, l0d := findLeaf(supported, leafFeatures, 0), findLeaf(supported, leafXSave, 0)
	available := uint64(0)
	if l0d != nil {
		available = uint64(l0d.EDX)<<32 | uint64(l0d.EAX)
	}
	plan.enabled = !p.PVM && l1 != nil && l1.ECX&ecx1XSAVE != 0 && available&xfeatureLegacy == xfeatureLegacy
	usable := xfeatureLegacy
	if plan.enabled {
		for i := uint32(2); i <= xsaveSubleafMax; i++ {
			bit := uint64(1) << i
			if available&bit == 0 || bit&xfeatureAMX != 0 {
				continue
			}
			if sub := findLeaf(supported, leafXSave, i); sub != nil && componentEnd(sub) <= MaxXSAVEAreaSize {
				usable |= bit
			}
		}
	}
	offered := map[string]bool{}
	for _, g := range xsaveGates {
		ok := usable&g.components == g.components && (g.needs == "" || offered[g.needs]) &&
			(g.needsLeaf1ECX == 0 || l1 != nil && l1.ECX&g.needsLeaf1ECX != 0)
		offered[g.name] = ok
		if ok {
			plan.xcr0 |= g.components
		} else {
			plan.hidden = plan.hidden.or(g.features)
		}
	}
	for i := uint32(2); i <= xsaveSubleafMax; i++ {
		if plan.xcr0&(1<<i) != 0 {
			plan.size = max(plan.size, componentEnd(findLeaf(supported, leafXSave, i)))
		}
	}
	return plan
}

// componentEnd is where a user state component's save area ends in the
// standard (non-compacted) XSAVE layout: its offset (EBX) plus size (EAX).
func componentEnd(sub *CPUIDEntry) uint32 {
	if sub.EBX < xsaveLegacyAreaSize || sub.EAX > MaxXSAVEAreaSize || sub.EBX > MaxXSAVEAreaSize {
		return MaxXSAVEAreaSize + 1 // no valid place in a 4 KiB area
	}
	return sub.EBX + sub.EAX
}

func (a featureBits) or(b featureBits) featureBits {
	return featureBits{
		leaf1ECX: a.leaf1ECX | b.leaf1ECX, leaf7EBX: a.leaf7EBX | b.leaf7EBX, leaf7ECX: a.leaf7ECX | b.leaf7ECX,
		leaf7EDX: a.leaf7EDX | b.leaf7EDX, leaf71EAX: a.leaf71EAX | b.leaf71EAX, leaf71EDX: a.leaf71EDX | b.leaf71EDX,
		extECX: a.extECX | b.extECX,
	}
}

// hide clears the plan's hidden feature bits (and XSAVE itself when not
// offered) from an entry of leaf 1, 7 or 0x80000001.
func (plan xsavePlan) hide(e *CPUIDEntry) {
	h := plan.hidden
	switch {
	case e.Function == leafFeatures:
		e.ECX &^= h.leaf1ECX
		if !plan.enabled {
			e.ECX &^= ecx1XSAVEFamily
		}
	case e.Function == leafExtFeatures && e.Index == 0:
		e.EBX &^= h.leaf7EBX
		e.ECX &^= h.leaf7ECX
		e.EDX &^= h.leaf7EDX
	case e.Function == leafExtFeatures && e.Index == 1:
		e.EAX &^= h.leaf71EAX
		e.EDX &^= h.leaf71EDX
	case e.Function == leafExtFeatures1:
		e.ECX &^= h.extECX
	}
}

// xsaveLeaves returns leaf 0xD for the plan: subleaf 0 with the offered
// components and the area size (EBX, the size for the XCR0 in force, KVM
// recomputes as the guest sets XCR0); subleaf 1 as KVM reports it
// (XSAVEOPT/XSAVEC/XSAVES and the supervisor components), or zero without
// XSAVE; and the subleaves of the offered components, user or supervisor.
func (plan xsavePlan) xsaveLeaves(supported []CPUIDEntry) []CPUIDEntry {
	f := CPUIDFlagSignificantIndex
	out := []CPUIDEntry{{Function: leafXSave, Index: 0, Flags: f,
		EAX: uint32(plan.xcr0), EDX: uint32(plan.xcr0 >> 32), EBX: plan.size, ECX: plan.size}}
	if !plan.enabled {
		return append(out, CPUIDEntry{Function: leafXSave, Index: 1, Flags: f})
	}
	var supervisor uint64
	if s1 := findLeaf(supported, leafXSave, 1); s1 != nil {
		out = append(out, *s1)
		supervisor = (uint64(s1.EDX)<<32 | uint64(s1.ECX)) &^ xfeatureAMX
	} else {
		out = append(out, CPUIDEntry{Function: leafXSave, Index: 1, Flags: f})
	}
	for i := uint32(2); i <= xsaveSubleafMax; i++ {
		if (plan.xcr0|supervisor)&(1<<i) == 0 {
			continue
		}
		if sub := findLeaf(supported, leafXSave, i); sub != nil {
			out = append(out, *sub)
		}
	}
	return out
}
