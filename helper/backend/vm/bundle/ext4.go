package bundle

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// ext4 superblock layout (Linux fs/ext4/ext4.h, struct ext4_super_block):
// 1024 bytes at byte 1024 of the filesystem, little-endian.
const (
	SuperblockOffset = 1024
	SuperblockSize   = 1024

	ext4Magic          = 0xEF53
	offBlocksCountLo   = 0x04
	offLogBlockSize    = 0x18
	offMagic           = 0x38
	offFeatureCompat   = 0x5C
	offFeatureIncompat = 0x60
	offFeatureROCompat = 0x64
	offUUID            = 0x68
	offVolumeName      = 0x78
	offBlocksCountHi   = 0x150
	offChecksumType    = 0x175
	offChecksum        = 0x3FC

	maxLogBlockSize = 6 // 64 KiB blocks, the largest Linux mounts
)

// ext4 feature flags this package reads.
const (
	CompatHasJournal      = 0x0004
	IncompatRecover       = 0x0004 // the journal needs recovery
	IncompatJournalDev    = 0x0008 // an external journal device, not a filesystem
	Incompat64Bit         = 0x0080
	ROCompatMetadataCsum  = 0x0400
	checksumTypeCRC32C    = 1
	superblockCsumCovered = offChecksum
)

// ErrNotExt4 says a region holds no ext2/3/4 superblock magic: it is some
// other filesystem, or none.
var ErrNotExt4 = errors.New("no ext4 superblock")

// Filesystem is what an ext4 (or ext2/ext3: one magic, one driver)
// superblock says, validated against the region it was read from.
type Filesystem struct {
	// Label is s_volume_name up to its first NUL, byte for byte (what
	// fstab's LABEL= and /dev/disk/by-label match); not necessarily UTF-8.
	Label string
	// UUID is s_uuid in its usual textual form.
	UUID string
	// BlockSize is in bytes, 1024 to 65536; Blocks is the block count.
	BlockSize uint32
	Blocks    uint64
	// HasJournal: the compat feature has_journal.
	HasJournal bool
	// NeedsRecovery: the incompat feature needs_recovery (RECOVER): the
	// filesystem was not cleanly unmounted and its journal must be
	// replayed before its contents are whole.
	NeedsRecovery bool
	// Compat, Incompat and ROCompat are the raw feature words.
	Compat, Incompat, ROCompat uint32
}

// Bytes is the filesystem's size, BlockSize × Blocks (validated to fit in
// the region it was read from, so it does not overflow).
func (f Filesystem) Bytes() int64 { return int64(f.Blocks) * int64(f.BlockSize) }

// ReadSuperblock reads the ext4 superblock of the region [start,
// start+length) of r and validates it against that region.
func ReadSuperblock(r io.ReaderAt, start, length int64) (Filesystem, error) {
	if length < SuperblockOffset+SuperblockSize {
		return Filesystem{}, fmt.Errorf("%d bytes: %w (too small for a filesystem)", length, ErrNotExt4)
	}
	var sb [SuperblockSize]byte
	if err := readFull(r, sb[:], start+SuperblockOffset); err != nil {
		return Filesystem{}, fmt.Errorf("ext4 superblock: %w", err)
	}
	return ParseSuperblock(sb[:], length)
}

// ParseSuperblock validates the 1024-byte superblock sb of a filesystem in
// a region of regionBytes: the magic (else ErrNotExt4), the block size, the
// checksum when metadata_csum is on, and a size that fits the region.
func ParseSuperblock(sb []byte, regionBytes int64) (Filesystem, error) {
	le := binary.LittleEndian
	if len(sb) < SuperblockSize {
		return Filesystem{}, fmt.Errorf("ext4 superblock: %d bytes, want %d", len(sb), SuperblockSize)
	}
	if le.Uint16(sb[offMagic:]) != ext4Magic {
		return Filesystem{}, ErrNotExt4
	}
	fs := Filesystem{
		Compat:   le.Uint32(sb[offFeatureCompat:]),
		Incompat: le.Uint32(sb[offFeatureIncompat:]),
		ROCompat: le.Uint32(sb[offFeatureROCompat:]),
		UUID:     formatUUID(sb[offUUID : offUUID+16]),
		Label:    string(labelBytes(sb[offVolumeName : offVolumeName+16])),
	}
	fs.HasJournal = fs.Compat&CompatHasJournal != 0
	fs.NeedsRecovery = fs.Incompat&IncompatRecover != 0
	if fs.Incompat&IncompatJournalDev != 0 {
		return Filesystem{}, errors.New("ext4 superblock: an external journal device, not a filesystem")
	}
	if err := checkSuperblockChecksum(sb, fs.ROCompat); err != nil {
		return Filesystem{}, err
	}
	logBlock := le.Uint32(sb[offLogBlockSize:])
	if logBlock > maxLogBlockSize {
		return Filesystem{}, fmt.Errorf("ext4 superblock: block size 2^(10+%d) is not one Linux mounts", logBlock)
	}
	fs.BlockSize = 1024 << logBlock
	fs.Blocks = uint64(le.Uint32(sb[offBlocksCountLo:]))
	if fs.Incompat&Incompat64Bit != 0 {
		fs.Blocks |= uint64(le.Uint32(sb[offBlocksCountHi:])) << 32
	}
	if fs.Blocks == 0 {
		return Filesystem{}, errors.New("ext4 superblock: zero blocks")
	}
	if regionBytes < 0 || fs.Blocks > uint64(regionBytes)/uint64(fs.BlockSize) {
		return Filesystem{}, fmt.Errorf("ext4 superblock claims %d blocks of %d bytes, larger than its partition of %d bytes",
			fs.Blocks, fs.BlockSize, regionBytes)
	}
	return fs, nil
}

// checkSuperblockChecksum checks s_checksum when metadata_csum is on: the
// raw CRC32C (seed ~0, no final inversion) of the bytes before it.
func checkSuperblockChecksum(sb []byte, roCompat uint32) error {
	if roCompat&ROCompatMetadataCsum == 0 {
		return nil
	}
	if t := sb[offChecksumType]; t != checksumTypeCRC32C {
		return fmt.Errorf("ext4 superblock: checksum type %d is not crc32c", t)
	}
	stored := binary.LittleEndian.Uint32(sb[offChecksum:])
	if got := superblockChecksum(sb); got != stored {
		return fmt.Errorf("ext4 superblock checksum mismatch (stored %#08x, computed %#08x)", stored, got)
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// superblockChecksum is ext4's s_checksum of sb: Linux's crc32c(~0, ...),
// which is Go's Castagnoli checksum without its final inversion.
func superblockChecksum(sb []byte) uint32 {
	return ^crc32.Checksum(sb[:superblockCsumCovered], castagnoli)
}

func labelBytes(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

func formatUUID(b []byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
