package loader

import (
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz seed files from the image builders")

// fuzzSeeds are tiny valid images of each kind.
func fuzzSeeds() map[string][]byte {
	bz := defaultBz()
	bz.kernel = pattern(0x240, 3)
	bz0 := bz
	bz0.setupSects = 0
	return map[string][]byte{
		"elf-pvh8": buildELF(elfSpec{entry: 0x1000000, segments: []elfSegment{
			{paddr: 0x1000000, memsz: 0x3000, data: pattern(0x45, 1)},
			{paddr: 0x1200000, memsz: 0x5000, data: pattern(0x20, 2)},
		}, pvhEntry: 0x1000040, pvh8: true, align: 16}),
		"elf-pvh4":      buildELF(elfSpec{entry: 0x1000000, segments: []elfSegment{{paddr: 0x1000000, memsz: 0x2000, data: pattern(0x40, 1)}}, pvhEntry: 0x1000020, align: 16}),
		"elf-nopvh":     buildELF(elfSpec{entry: 0x1100000, segments: []elfSegment{{paddr: 0x1100000, memsz: 0x1000, data: pattern(0x30, 2)}}, align: 16}),
		"bzimage":       buildBzImage(bz),
		"bzimage-sect0": buildBzImage(bz0),
	}
}

// fuzzMem is small so a fuzzed bss stays cheap, yet holds the seeds'
// kernels at 16 MiB.
const fuzzMem = 32 << 20

// TestFuzzSeedCorpus keeps testdata/fuzz/FuzzLoadKernel in step with the
// builders (go test -run TestFuzzSeedCorpus -update-seeds rewrites it).
func TestFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzLoadKernel")
	for name, img := range fuzzSeeds() {
		want := []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(img)) + ")\n")
		path := filepath.Join(dir, "seed-"+name)
		if *updateSeeds {
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(path, want, 0o644))
			continue
		}
		got, err := os.ReadFile(path)
		require.NoError(t, err, "run go test -run TestFuzzSeedCorpus -update-seeds")
		require.True(t, bytes.Equal(want, got), "%s is stale: run go test -run TestFuzzSeedCorpus -update-seeds", path)
		// Every seed must load.
		_, err = LoadKernel(newSparseMemory(fuzzMem), fuzzMem, img)
		require.NoError(t, err, name)
	}
}

// FuzzLoadKernel feeds arbitrary images to LoadKernel and checks that a
// rejected image writes nothing and an accepted one stays inside what it
// claims.
func FuzzLoadKernel(f *testing.F) {
	for _, img := range fuzzSeeds() {
		f.Add(img)
	}
	f.Fuzz(func(t *testing.T, image []byte) {
		mem := newSparseMemory(fuzzMem)
		k, err := LoadKernel(mem, fuzzMem, image)
		if err != nil {
			if !errors.Is(err, ErrBadImage) {
				t.Fatalf("rejection not wrapping ErrBadImage: %v", err)
			}
			if mem.writes != 0 {
				t.Fatalf("rejected image wrote %d times: %v", mem.writes, err)
			}
			return
		}
		if err := checkKernel(k, mem); err != nil {
			t.Fatal(err)
		}
		if k.Format == FormatELF {
			if err := crossCheckELF(k, image); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func checkKernel(k Kernel, mem *sparseMemory) error {
	switch {
	case k.Format != FormatELF && k.Format != FormatBzImage:
		return fmt.Errorf("format %v", k.Format)
	case k.LoadAddr < x86.HighMemStart || k.LoadEnd > fuzzMem || k.LoadAddr >= k.LoadEnd:
		return fmt.Errorf("load range [%#x, %#x) outside RAM above 1 MiB", k.LoadAddr, k.LoadEnd)
	case k.Entry64 < k.LoadAddr || k.Entry64 >= k.LoadEnd:
		return fmt.Errorf("entry %#x outside [%#x, %#x)", k.Entry64, k.LoadAddr, k.LoadEnd)
	case k.PVHEntry != 0 && (k.PVHEntry < k.LoadAddr || k.PVHEntry >= k.LoadEnd):
		return fmt.Errorf("PVH entry %#x outside [%#x, %#x)", k.PVHEntry, k.LoadAddr, k.LoadEnd)
	case mem.writes > 0 && (mem.lowest < k.LoadAddr || mem.highest > k.LoadEnd):
		return fmt.Errorf("wrote [%#x, %#x) outside the kernel's [%#x, %#x)", mem.lowest, mem.highest, k.LoadAddr, k.LoadEnd)
	case k.CmdlineMaxSize < 1 || uint64(k.CmdlineMaxSize) > cmdlineRoom:
		return fmt.Errorf("command line limit %d", k.CmdlineMaxSize)
	case k.Format == FormatBzImage && (len(k.SetupHeader) == 0 || len(k.SetupHeader) > x86.SetupHeaderMaxSize):
		return fmt.Errorf("setup header of %d bytes", len(k.SetupHeader))
	}
	return nil
}

// crossCheckELF compares an accepted vmlinux with what the standard
// library's ELF reader makes of it, when it can read it (it also checks
// section headers, which the loader ignores).
func crossCheckELF(k Kernel, image []byte) error {
	f, err := elf.NewFile(bytes.NewReader(image))
	if err != nil {
		return nil
	}
	if f.Entry != k.Entry64 {
		return fmt.Errorf("entry %#x, debug/elf says %#x", k.Entry64, f.Entry)
	}
	lowest, end := ^uint64(0), uint64(0)
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			lowest, end = min(lowest, p.Paddr), max(end, p.Paddr+p.Memsz)
		}
	}
	if lowest != k.LoadAddr || end != k.LoadEnd {
		return fmt.Errorf("load range [%#x, %#x), debug/elf says [%#x, %#x)", k.LoadAddr, k.LoadEnd, lowest, end)
	}
	return nil
}
