package bundle

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGUIDOnDiskOrder(t *testing.T) {
	want := []byte{0xe3, 0xbc, 0x68, 0x4f, 0xcd, 0xe8, 0xb1, 0x4d, 0x96, 0xe7, 0xfb, 0xca, 0xf9, 0x84, 0xb7, 0x09}
	assert.Equal(t, want, LinuxRootX86_64[:], "mixed-endian as GPT stores it")
	assert.Equal(t, "4f68bce3-e8cd-4db1-96e7-fbcaf984b709", LinuxRootX86_64.String())
	_, err := ParseGUID("4f68bce3e8cd4db196e7fbcaf984b709")
	assert.Error(t, err)
}

func TestReadTableGPT(t *testing.T) {
	disk := cloudLayout(RootLabel).build(t)
	table, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
	require.NoError(t, err)
	assert.Equal(t, TableGPT, table.Kind)
	assert.Empty(t, table.Notes)
	require.Len(t, table.Partitions, 3)
	p1 := table.Partitions[0]
	assert.Equal(t, 1, p1.Number, "partitions come by number")
	assert.Equal(t, int64(256*SectorSize), p1.Start)
	assert.Equal(t, int64((4000-256+1)*SectorSize), p1.Length)
	assert.Equal(t, "root", p1.Name)
	assert.Equal(t, "EFI system", table.Partitions[2].TypeName())
	assert.Equal(t, 15, table.Partitions[2].Number)
}

// corruptPrimary flips a byte of the primary GPT header (header CRC) or of
// the primary partition array (array CRC).
func TestCorruptPrimaryGPTUsesBackup(t *testing.T) {
	for name, off := range map[string]int{
		"header CRC mismatch":          SectorSize + 40, // first usable LBA
		"partition array CRC mismatch": 2*SectorSize + 32,
	} {
		t.Run(name, func(t *testing.T) {
			disk := cloudLayout(RootLabel).build(t)
			disk[off] ^= 0xFF
			table, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
			require.NoError(t, err)
			require.Len(t, table.Partitions, 3)
			assert.Equal(t, int64(256*SectorSize), table.Partitions[0].Start)
			require.Len(t, table.Notes, 1)
			assert.Contains(t, table.Notes[0], name)
			assert.Contains(t, table.Notes[0], "the backup at LBA 4095 is used")
		})
	}
}

func TestCorruptGPTWithoutBackupIsAnError(t *testing.T) {
	disk := cloudLayout(RootLabel).build(t)
	disk[SectorSize+40] ^= 0xFF
	clear(disk[len(disk)-SectorSize:]) // the backup header
	_, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "header CRC mismatch")
	assert.Contains(t, err.Error(), "no valid backup (LBA 4095): no GPT signature")
}

// TestTruncatedGPTImage: a download cut short has a primary whose usable
// range runs past the file and no backup: an error that says so.
func TestTruncatedGPTImage(t *testing.T) {
	disk := cloudLayout(RootLabel).build(t)[:2048*SectorSize]
	_, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "usable LBAs 34..4062 do not fit a disk whose last LBA is 2047 (truncated?)")
}

// TestGPTHeaderBounds: header fields that would make the reader allocate
// or read without bound are refused before any allocation.
func TestGPTHeaderBounds(t *testing.T) {
	cases := map[string]struct {
		off   int
		value uint64
		size  int
		want  string
	}{
		"huge entry count":    {80, 0xFFFFFFFF, 4, "exceeds 1048576 bytes"},
		"odd entry size":      {84, 200, 4, "entry size 200 is not a power of two"},
		"array past the end":  {72, 1 << 40, 8, "partition array at LBA 1099511627776"},
		"header size":         {12, 4096, 4, "header size 4096 outside [92, 512]"},
		"wrong own LBA":       {24, 7, 8, "header says it is at LBA 7, read at LBA 1"},
		"usable past the end": {48, 1 << 50, 8, "do not fit a disk"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			g := cloudLayout(RootLabel)
			disk := g.build(t)
			clear(disk[len(disk)-SectorSize:])
			h := disk[SectorSize : SectorSize+92]
			if c.size == 4 {
				binary.LittleEndian.PutUint32(h[c.off:], uint32(c.value))
			} else {
				binary.LittleEndian.PutUint64(h[c.off:], c.value)
			}
			resealHeader(h)
			_, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// resealHeader recomputes the CRC of a 92-byte GPT header after an edit,
// so that the edit itself is what the reader judges.
func resealHeader(h []byte) {
	binary.LittleEndian.PutUint32(h[16:], 0)
	binary.LittleEndian.PutUint32(h[16:], crcIEEE(h[:92]))
}

func TestGPTPartitionChecks(t *testing.T) {
	outside := cloudLayout(RootLabel)
	outside.parts[2].last = 4090 // past last usable 4062
	overlap := cloudLayout(RootLabel)
	overlap.parts[1].last = 300
	for name, c := range map[string]struct {
		g    testGPT
		want string
	}{
		"outside the usable range": {outside, "partition 1: LBAs 256..4090 outside the usable 34..4062"},
		"overlapping":              {overlap, "partitions 15 and 1 overlap"},
	} {
		t.Run(name, func(t *testing.T) {
			disk := c.g.build(t)
			_, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestReadTableMBR(t *testing.T) {
	disk := testMBRDisk(2048,
		testPartition{number: 1, mbrType: 0x83, first: 2, last: 999},
		testPartition{number: 2, mbrType: 0x05, first: 1000, last: 1100},
		testPartition{number: 3, mbrType: 0x83, first: 1200, last: 2047},
	)
	table, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
	require.NoError(t, err)
	assert.Equal(t, TableMBR, table.Kind)
	require.Len(t, table.Partitions, 2)
	assert.Equal(t, 3, table.Partitions[1].Number)
	assert.Equal(t, int64(1200*SectorSize), table.Partitions[1].Start)
	assert.Equal(t, int64(848*SectorSize), table.Partitions[1].Length)
	assert.Equal(t, "MBR type 0x83", table.Partitions[1].TypeName())
	require.Len(t, table.Notes, 1)
	assert.Contains(t, table.Notes[0], "MBR partition 2 is extended")
}

func TestMBRPartitionPastTheEnd(t *testing.T) {
	disk := testMBRDisk(2048, testPartition{number: 1, mbrType: 0x83, first: 2, last: 4000})
	_, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "MBR partition 1: ends at byte 2048512, past the image's end at 1048576")
}

// TestBootCodeIsNotAnMBR: 0x55AA with boot indicators that are neither
// 0x00 nor 0x80 is a boot sector's code, not a table.
func TestBootCodeIsNotAnMBR(t *testing.T) {
	disk := testMBRDisk(2048, testPartition{number: 1, mbrType: 0x83, first: 2, last: 4000})
	disk[mbrEntriesOffset] = 0x31
	table, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
	require.NoError(t, err)
	assert.Equal(t, TableNone, table.Kind)
}

func TestProtectiveMBRWithoutGPTIsAnError(t *testing.T) {
	disk := testMBRDisk(2048, testPartition{number: 1, mbrType: mbrTypeGPT, first: 1, last: 2047})
	_, err := ReadTable(bytes.NewReader(disk), int64(len(disk)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "GPT: primary header (LBA 1): no GPT signature; and no valid backup")
}
