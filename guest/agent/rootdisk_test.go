package agent

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
)

// superblock is an ext4 superblock's first bytes with a block count and
// 1024<<logSize bytes per block.
func superblock(blocks uint64, logSize uint32, is64 bool) []byte {
	raw := make([]byte, ext4SuperblockSize)
	le := binary.LittleEndian
	le.PutUint16(raw[0x38:], ext4Magic)
	le.PutUint32(raw[0x18:], logSize)
	le.PutUint32(raw[0x04:], uint32(blocks))
	if is64 {
		le.PutUint32(raw[0x60:], ext4Incompat64Bit)
		le.PutUint32(raw[0x150:], uint32(blocks>>32))
	}
	return raw
}

func TestParseExt4Superblock(t *testing.T) {
	const gib = 1 << 30
	sb := parseExt4Superblock(superblock(gib/4096, 2, false), gib)
	assert.True(t, sb.formatted)
	assert.Equal(t, uint64(4096), sb.blockSize)
	assert.Equal(t, uint64(gib/4096), sb.blocks)
	assert.Zero(t, sb.blocksShort(), "the file system fills the disk: no resize (each one flushes the journal)")

	sb = parseExt4Superblock(superblock(gib/4096, 2, false), 2*gib)
	assert.Equal(t, uint64(gib/4096), sb.blocksShort(), "createVM grew the disk")
	assert.Equal(t, uint64(2*gib/4096), sb.diskBlocks())

	big := uint64(1)<<32 + 5
	sb = parseExt4Superblock(superblock(big, 2, true), big*4096)
	assert.Equal(t, big, sb.blocks, "64bit: s_blocks_count_hi counts")
	assert.Zero(t, sb.blocksShort())
	sb = parseExt4Superblock(superblock(big, 2, false), big*4096)
	assert.Equal(t, uint64(5), sb.blocks, "without 64bit the high word is not read")
}

func TestParseExt4SuperblockRefusesWhatIsNotOne(t *testing.T) {
	blank := make([]byte, ext4SuperblockSize)
	assert.False(t, parseExt4Superblock(blank, 1<<30).formatted, "a blank disk")
	assert.False(t, parseExt4Superblock(superblock(100, 7, false), 1<<30).formatted, "blocks larger than 64 KiB")
	assert.False(t, parseExt4Superblock(superblock(100, 2, false)[:0x40], 1<<30).formatted, "short")
	unformatted := parseExt4Superblock(blank, 1<<30)
	assert.Zero(t, unformatted.blocksShort(), "never grown: formatted to the whole disk")
}

func FuzzParseExt4Superblock(f *testing.F) {
	f.Add(superblock(1<<18, 2, true), uint64(1<<30))
	f.Add(make([]byte, 8), uint64(0))
	f.Fuzz(func(t *testing.T, raw []byte, disk uint64) {
		sb := parseExt4Superblock(raw, disk)
		if sb.formatted {
			assert.GreaterOrEqual(t, sb.blockSize, uint64(1024))
			assert.LessOrEqual(t, sb.blockSize, uint64(64<<10))
		}
		_ = sb.blocksShort() // no division by zero, no panic
	})
}
