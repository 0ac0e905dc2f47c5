package x86

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz seed files from the fixtures")

const cpuidEntryBytes = 28

// encodeCPUIDInput packs a policy and a supported table for the fuzzer:
// byte 0 the vCPU count, byte 1 the vCPU index, byte 2 flags (bit 0 PVM,
// bit 1 TSC deadline), then 28-byte entries.
func encodeCPUIDInput(p CPUIDPolicy, entries []CPUIDEntry) []byte {
	b := []byte{byte(p.CPUCount), byte(p.VCPUIndex), 0}
	if p.PVM {
		b[2] |= 1
	}
	if p.TSCDeadlineTimer {
		b[2] |= 2
	}
	for _, e := range entries {
		for _, v := range []uint32{e.Function, e.Index, e.Flags, e.EAX, e.EBX, e.ECX, e.EDX} {
			b = binary.LittleEndian.AppendUint32(b, v)
		}
	}
	return b
}

func decodeCPUIDInput(b []byte) (CPUIDPolicy, []CPUIDEntry) {
	if len(b) < 3 {
		return CPUIDPolicy{}, nil
	}
	p := CPUIDPolicy{CPUCount: int(b[0]), VCPUIndex: int(b[1]), PVM: b[2]&1 != 0, TSCDeadlineTimer: b[2]&2 != 0}
	var entries []CPUIDEntry
	for rest := b[3:]; len(rest) >= cpuidEntryBytes; rest = rest[cpuidEntryBytes:] {
		u := func(i int) uint32 { return binary.LittleEndian.Uint32(rest[4*i:]) }
		entries = append(entries, CPUIDEntry{u(0), u(1), u(2), u(3), u(4), u(5), u(6)})
	}
	return p, entries
}

func cpuidSeeds() map[string][]byte {
	return map[string][]byte{
		"intel-4cpus":    encodeCPUIDInput(CPUIDPolicy{CPUCount: 4, VCPUIndex: 3}, intelSupported()),
		"amd-2cpus-pvm":  encodeCPUIDInput(CPUIDPolicy{CPUCount: 2, VCPUIndex: 0, PVM: true, TSCDeadlineTimer: true}, amdSupported()),
		"intel-1cpu-pvm": encodeCPUIDInput(CPUIDPolicy{CPUCount: 1, PVM: true}, intelSupported()),
	}
}

// TestCPUIDFuzzSeedCorpus keeps testdata/fuzz/FuzzCPUIDForVCPU in step
// with the fixtures (-update-seeds rewrites it).
func TestCPUIDFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzCPUIDForVCPU")
	for name, in := range cpuidSeeds() {
		want := []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(in)) + ")\n")
		path := filepath.Join(dir, "seed-"+name)
		if *updateSeeds {
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(path, want, 0o644))
			continue
		}
		got, err := os.ReadFile(path)
		require.NoError(t, err, "run go test -run TestCPUIDFuzzSeedCorpus -update-seeds")
		require.True(t, bytes.Equal(want, got), "%s is stale: run go test -run TestCPUIDFuzzSeedCorpus -update-seeds", path)
		p, entries := decodeCPUIDInput(in)
		_, err = CPUIDForVCPU(entries, p)
		require.NoError(t, err, name)
	}
}

// FuzzCPUIDForVCPU checks the policy's invariants on arbitrary supported
// tables: never a panic, and an accepted table always says it is KVM, has
// the hypervisor bit, the APIC ID, no SGX/PT leaves, is sorted and within
// KVM's entry limit; under PVM, CX16 and XSAVE are always off.
func FuzzCPUIDForVCPU(f *testing.F) {
	for _, s := range cpuidSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		p, supported := decodeCPUIDInput(in)
		out, err := CPUIDForVCPU(supported, p)
		if err != nil {
			return
		}
		if err := checkCPUID(out, p); err != nil {
			t.Fatal(err)
		}
	})
}

func checkCPUID(out []CPUIDEntry, p CPUIDPolicy) error {
	if len(out) > MaxCPUIDEntries {
		return fmt.Errorf("%d entries", len(out))
	}
	for i := 1; i < len(out); i++ {
		a, b := out[i-1], out[i]
		if a.Function > b.Function || (a.Function == b.Function && a.Index > b.Index) {
			return fmt.Errorf("unsorted at %d", i)
		}
	}
	hv := findLeaf(out, leafHypervisor, 0)
	if hv == nil || hv.EAX != leafKVMFeatures || hv.EBX != 0x4b4d564b {
		return fmt.Errorf("no KVM signature leaf: %+v", hv)
	}
	if err := checkXSAVE(out); err != nil {
		return err
	}
	for _, e := range out {
		if e.Function == leafSGX || e.Function == leafProcessorTrace {
			return fmt.Errorf("leaf %#x kept", e.Function)
		}
		if e.Function == leafFeatures {
			if e.ECX&ecx1Hypervisor == 0 || e.EBX>>24 != uint32(p.VCPUIndex) {
				return fmt.Errorf("leaf 1 %+v", e)
			}
			if p.PVM && e.ECX&(ecx1CX16|ecx1XSAVE|ecx1OSXSAVE|ecx1AVX) != 0 {
				return fmt.Errorf("PVM leaf 1 %+v", e)
			}
		}
	}
	return nil
}

// checkXSAVE: a feature whose registers live in XSAVE state is offered
// only with XSAVE and its states, the area fits kvm_xsave, AMX never.
func checkXSAVE(out []CPUIDEntry) error {
	var xcr0 uint64
	if d0 := findLeaf(out, leafXSave, 0); d0 != nil {
		if d0.ECX > MaxXSAVEAreaSize {
			return fmt.Errorf("XSAVE area of %d bytes", d0.ECX)
		}
		xcr0 = uint64(d0.EDX)<<32 | uint64(d0.EAX)
	}
	var l1, l7 CPUIDEntry
	if e := findLeaf(out, leafFeatures, 0); e != nil {
		l1 = *e
	}
	if e := findLeaf(out, leafExtFeatures, 0); e != nil {
		l7 = *e
	}
	if xcr0&xfeatureAMX != 0 || l7.EDX&(edx7AMXTile|edx7AMXInt8|edx7AMXBF16) != 0 {
		return fmt.Errorf("AMX offered: XCR0 %#x, leaf 7 EDX %#x", xcr0, l7.EDX)
	}
	avx := l1.ECX&ecx1AVX != 0 || l7.EBX&ebx7AVX2 != 0
	if avx && (l1.ECX&ecx1XSAVE == 0 || xcr0&(xfeatureLegacy|xfeatureYMM) != xfeatureLegacy|xfeatureYMM) {
		return fmt.Errorf("AVX without XSAVE or its state: leaf 1 ECX %#x, XCR0 %#x", l1.ECX, xcr0)
	}
	if l7.EBX&ebx7AVX512F != 0 && (l1.ECX&ecx1AVX == 0 || xcr0&xfeatureAVX512 != xfeatureAVX512) {
		return fmt.Errorf("AVX-512 without AVX or its states: XCR0 %#x", xcr0)
	}
	return nil
}
