package bundle

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/require"
)

// testSuperblock describes an ext4 superblock for tests to lay down.
type testSuperblock struct {
	label                      string
	uuid                       [16]byte
	logBlockSize               uint32
	blocks                     uint64
	compat, incompat, roCompat uint32
}

// bytes encodes sb as a 1024-byte superblock, with its checksum when
// metadata_csum is among its features.
func (sb testSuperblock) bytes() []byte {
	b := make([]byte, SuperblockSize)
	le := binary.LittleEndian
	le.PutUint32(b[offBlocksCountLo:], uint32(sb.blocks))
	le.PutUint32(b[offBlocksCountHi:], uint32(sb.blocks>>32))
	le.PutUint32(b[offLogBlockSize:], sb.logBlockSize)
	le.PutUint16(b[offMagic:], ext4Magic)
	le.PutUint32(b[offFeatureCompat:], sb.compat)
	le.PutUint32(b[offFeatureIncompat:], sb.incompat)
	le.PutUint32(b[offFeatureROCompat:], sb.roCompat)
	copy(b[offUUID:], sb.uuid[:])
	copy(b[offVolumeName:offVolumeName+16], sb.label)
	if sb.roCompat&ROCompatMetadataCsum != 0 {
		b[offChecksumType] = checksumTypeCRC32C
		le.PutUint32(b[offChecksum:], superblockChecksum(b))
	}
	return b
}

// ext4SB is a valid journalled superblock of 1 KiB blocks filling bytes.
func ext4SB(label string, bytes int64) testSuperblock {
	return testSuperblock{label: label, uuid: [16]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
		blocks: uint64(bytes / 1024), compat: CompatHasJournal, roCompat: ROCompatMetadataCsum}
}

// testPartition is a GPT or MBR entry for tests: LBAs first..last
// inclusive, and the superblock (if any) laid at its start + 1024.
type testPartition struct {
	number      int // GPT entry number (1-based); MBR slot
	typ         GUID
	mbrType     byte
	first, last uint64
	name        string
	sb          *testSuperblock
}

// testGPT lays out a disk of sectors sectors with a protective MBR, a
// primary GPT at LBA 1 with its array at LBA 2, and the backup array and
// header at the end; entries is the array's entry count.
type testGPT struct {
	sectors uint64
	entries uint32
	parts   []testPartition
}

func (g testGPT) arraySectors() uint64 { return (uint64(g.entries)*128 + SectorSize - 1) / SectorSize }
func (g testGPT) firstUsable() uint64  { return 2 + g.arraySectors() }
func (g testGPT) lastUsable() uint64   { return g.sectors - 2 - g.arraySectors() }

func (g testGPT) build(t testing.TB) []byte {
	t.Helper()
	disk := make([]byte, g.sectors*SectorSize)
	g.lay(func(off uint64, b []byte) { copy(disk[off:], b) })
	return disk
}

// writeSparse lays g out in a new sparse file at path: only the tables
// and superblocks are written, so a 10 GiB image costs a few KiB.
func (g testGPT) writeSparse(t testing.TB, path string) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(int64(g.sectors*SectorSize)))
	g.lay(func(off uint64, b []byte) {
		_, err := f.WriteAt(b, int64(off))
		require.NoError(t, err)
	})
}

// lay writes the protective MBR, both GPTs and the superblocks through
// write (a byte offset and the bytes there).
func (g testGPT) lay(write func(off uint64, b []byte)) {
	var mbr [SectorSize]byte
	writeMBR(mbr[:], []testPartition{{number: 1, mbrType: mbrTypeGPT, first: 1, last: min(g.sectors-1, 0xFFFFFFFF)}})
	write(0, mbr[:])
	array := make([]byte, uint64(g.entries)*128)
	for _, p := range g.parts {
		e := array[(p.number-1)*128:][:128]
		copy(e[0:16], p.typ[:])
		e[16] = byte(p.number)
		binary.LittleEndian.PutUint64(e[32:], p.first)
		binary.LittleEndian.PutUint64(e[40:], p.last)
		for i, u := range utf16.Encode([]rune(p.name)) {
			binary.LittleEndian.PutUint16(e[56+2*i:], u)
		}
		if p.sb != nil {
			write(p.first*SectorSize+SuperblockOffset, p.sb.bytes())
		}
	}
	lastLBA := g.sectors - 1
	backupArray := lastLBA - g.arraySectors()
	write(2*SectorSize, array)
	write(backupArray*SectorSize, array)
	arrayCRC := crc32.ChecksumIEEE(array)
	write(SectorSize, g.header(1, lastLBA, 2, arrayCRC))
	write(lastLBA*SectorSize, g.header(lastLBA, 1, backupArray, arrayCRC))
}

// header encodes a GPT header at myLBA, with its CRC.
func (g testGPT) header(myLBA, altLBA, entryLBA uint64, arrayCRC uint32) []byte {
	h := make([]byte, 92)
	le := binary.LittleEndian
	copy(h, gptSignature)
	le.PutUint32(h[8:], 0x00010000)
	le.PutUint32(h[12:], 92)
	le.PutUint64(h[24:], myLBA)
	le.PutUint64(h[32:], altLBA)
	le.PutUint64(h[40:], g.firstUsable())
	le.PutUint64(h[48:], g.lastUsable())
	copy(h[56:72], "disk-guid-123456")
	le.PutUint64(h[72:], entryLBA)
	le.PutUint32(h[80:], g.entries)
	le.PutUint32(h[84:], 128)
	le.PutUint32(h[88:], arrayCRC)
	le.PutUint32(h[16:], crc32.ChecksumIEEE(h))
	return h
}

// writeMBR writes an MBR holding parts (slots by number) into disk.
func writeMBR(disk []byte, parts []testPartition) {
	for _, p := range parts {
		e := disk[mbrEntriesOffset+(p.number-1)*mbrEntrySize:][:mbrEntrySize]
		e[4] = p.mbrType
		binary.LittleEndian.PutUint32(e[8:], uint32(p.first))
		binary.LittleEndian.PutUint32(e[12:], uint32(p.last-p.first+1))
	}
	disk[510], disk[511] = 0x55, 0xAA
}

// testMBRDisk lays out a disk with an MBR of parts and their filesystems.
func testMBRDisk(sectors uint64, parts ...testPartition) []byte {
	disk := make([]byte, sectors*SectorSize)
	writeMBR(disk, parts)
	for _, p := range parts {
		layFilesystem(disk, p)
	}
	return disk
}

func layFilesystem(disk []byte, p testPartition) {
	if p.sb != nil {
		copy(disk[p.first*SectorSize+SuperblockOffset:], p.sb.bytes())
	}
}

// partSB returns a superblock filling the partition first..last.
func partSB(label string, first, last uint64) *testSuperblock {
	sb := ext4SB(label, int64(last-first+1)*SectorSize)
	return &sb
}

// writeImage writes data as name in dir and returns its path.
func writeImage(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path
}

// inspectFile opens and inspects the image at path.
func inspectFile(t testing.TB, path string) (Image, error) {
	t.Helper()
	f, err := OpenImage(path)
	require.NoError(t, err)
	defer f.Close()
	return Inspect(f)
}

// cloudLayout is the client's rootfs.img layout in small: partition 14
// BIOS boot, 15 EFI system (not ext4), 1 ext4 with label, on a disk of
// 4096 sectors (2 MiB).
func cloudLayout(rootLabel string) testGPT {
	return testGPT{sectors: 4096, entries: 128, parts: []testPartition{
		{number: 14, typ: BIOSBoot, first: 34, last: 41},
		{number: 15, typ: EFISystem, first: 42, last: 255, name: "UEFI"},
		{number: 1, typ: LinuxFilesystem, first: 256, last: 4000, name: "root", sb: partSB(rootLabel, 256, 4000)},
	}}
}

func crcIEEE(b []byte) uint32 { return crc32.ChecksumIEEE(b) }
