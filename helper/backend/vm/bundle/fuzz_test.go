package bundle

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// tableSeeds are small images for the table and image fuzzers: a GPT (and
// its corruptions), an MBR, a bare ext4, nothing.
func tableSeeds(t testing.TB) [][]byte {
	small := testGPT{sectors: 96, entries: 4, parts: []testPartition{
		{number: 1, typ: LinuxFilesystem, first: 8, last: 60, sb: partSB(RootLabel, 8, 60)},
		{number: 2, typ: LinuxRootX86_64, first: 61, last: 90, sb: partSB("b", 61, 90)},
	}}
	gpt := small.build(t)
	badPrimary := bytes.Clone(gpt)
	badPrimary[SectorSize+40] ^= 1
	badBoth := bytes.Clone(badPrimary)
	badBoth[len(badBoth)-SectorSize+40] ^= 1
	mbr := testMBRDisk(64,
		testPartition{number: 1, mbrType: 0x83, first: 4, last: 40, sb: partSB("m", 4, 40)},
		testPartition{number: 2, mbrType: 0x05, first: 41, last: 63})
	bare := make([]byte, 8192)
	copy(bare[SuperblockOffset:], ext4SB("bare", 8192).bytes())
	return [][]byte{gpt, badPrimary, badBoth, mbr, bare, make([]byte, 2048), nil}
}

// The table and image fuzzers' inputs are images of tens of KiB; run them
// with little or no minimization (scripts/fuzz.sh uses 0), or each new
// input costs a minute of it:
//
//	go test -run XXX -fuzz 'FuzzImage$' -fuzzminimizetime 50x ./helper/backend/vm/bundle

// FuzzReadTable: any bytes give a table or an error, never a panic; a
// table's partitions lie inside the image, are sector-aligned, not empty,
// bounded in number and do not overlap.
func FuzzReadTable(f *testing.F) {
	for _, s := range tableSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		size := int64(len(data))
		table, err := ReadTable(bytes.NewReader(data), size)
		if err != nil {
			return
		}
		if len(table.Partitions) > maxPartitions {
			t.Fatalf("%d partitions", len(table.Partitions))
		}
		checkPartitionInvariants(t, table.Partitions, size)
	})
}

func checkPartitionInvariants(t *testing.T, ps []Partition, size int64) {
	t.Helper()
	sorted := append([]Partition(nil), ps...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Start < sorted[j].Start })
	end := int64(0)
	for _, p := range sorted {
		if p.Start < SectorSize || p.Length <= 0 || p.Start%SectorSize != 0 || p.Length%SectorSize != 0 ||
			p.Start+p.Length > size || p.Start < end || p.Number < 1 {
			t.Fatalf("bad partition %+v in an image of %d bytes (previous ends at %d)", p, size, end)
		}
		end = p.Start + p.Length
	}
}

// FuzzParseSuperblock: a superblock either parses into a filesystem that
// fits its region, with a valid block size and a label of at most 16
// bytes, or is an error; never a panic.
func FuzzParseSuperblock(f *testing.F) {
	good := ext4SB(RootLabel, 1<<20)
	dirty := good
	dirty.incompat |= IncompatRecover | Incompat64Bit
	plain := good
	plain.roCompat = 0
	for _, sb := range []testSuperblock{good, dirty, plain} {
		f.Add(sb.bytes(), int64(1<<20))
		f.Add(sb.bytes(), int64(1<<19))
	}
	f.Add(make([]byte, SuperblockSize), int64(0))
	f.Fuzz(func(t *testing.T, sb []byte, region int64) {
		fs, err := ParseSuperblock(sb, region)
		if err != nil {
			if errors.Is(err, ErrNotExt4) && len(sb) >= SuperblockSize && sb[offMagic] == 0x53 && sb[offMagic+1] == 0xEF {
				t.Fatalf("magic present but ErrNotExt4: %v", err)
			}
			return
		}
		if fs.BlockSize < 1024 || fs.BlockSize > 65536 || fs.BlockSize&(fs.BlockSize-1) != 0 {
			t.Fatalf("block size %d", fs.BlockSize)
		}
		if fs.Blocks == 0 || fs.Bytes() <= 0 || fs.Bytes() > region {
			t.Fatalf("filesystem of %d blocks (%d bytes) in a region of %d", fs.Blocks, fs.Bytes(), region)
		}
		if len(fs.Label) > 16 || len(fs.UUID) != 36 {
			t.Fatalf("label %q uuid %q", fs.Label, fs.UUID)
		}
	})
}

// FuzzImage: the whole read of an image (table, superblocks, root,
// identity) on any bytes; a chosen root lies inside the image and holds
// its filesystem.
func FuzzImage(f *testing.F) {
	for _, s := range tableSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		size := int64(len(data))
		r := bytes.NewReader(data)
		img, err := inspect(r, size)
		if err != nil {
			return
		}
		if _, err := identify(r, size, time.Unix(0, 0), img); err != nil {
			t.Fatalf("identity of an inspected image: %v", err)
		}
		root, err := SelectRoot(img)
		if err != nil {
			return
		}
		if root.Offset() < 0 || root.Offset()+root.Length() > size || root.FS.Bytes() > root.Length() {
			t.Fatalf("root %+v outside an image of %d bytes", root.Volume, size)
		}
	})
}

// TestCorruptedSeedsKeepInvariants runs the fuzzers' checks on seeded
// random corruptions of the seeds, so that every plain test run (not only
// go test -fuzz) feeds the readers broken tables and superblocks.
func TestCorruptedSeedsKeepInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 1))
	for i, seed := range tableSeeds(t) {
		if len(seed) == 0 {
			continue
		}
		for range 300 {
			data := bytes.Clone(seed)
			for range 1 + rng.IntN(8) {
				data[corruptionOffset(rng, len(data))] = byte(rng.Uint32())
			}
			size := int64(len(data))
			table, err := ReadTable(bytes.NewReader(data), size)
			if err == nil {
				checkPartitionInvariants(t, table.Partitions, size)
			}
			img, err := inspect(bytes.NewReader(data), size)
			if err != nil {
				continue
			}
			if root, err := SelectRoot(img); err == nil && root.Offset()+root.Length() > size {
				t.Fatalf("seed %d: root %+v outside %d bytes", i, root.Volume, size)
			}
		}
	}
}

// corruptionOffset picks a byte to corrupt, mostly in the structures
// (MBR, GPT headers, arrays, superblocks) rather than in empty space.
func corruptionOffset(rng *rand.Rand, n int) int {
	hot := []int{446 + rng.IntN(66), SectorSize + rng.IntN(92), 2*SectorSize + rng.IntN(SectorSize),
		n - SectorSize + rng.IntN(92), rng.IntN(n)}
	off := hot[rng.IntN(len(hot))]
	return min(max(off, 0), n-1)
}
