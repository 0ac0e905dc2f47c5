package agent

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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

// TestCheckpointJournalEmptiesIt: once a session's writes are synced the
// root disk's journal still holds them, for the next mount to replay;
// checkpointJournal leaves it empty (dumpe2fs's "Journal start: 0").
func TestCheckpointJournalEmptiesIt(t *testing.T) {
	for _, tool := range []string{"mke2fs", "dumpe2fs", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (e2fsprogs, util-linux): %v", tool, err)
		}
	}
	img, dir := filepath.Join(t.TempDir(), "root.img"), t.TempDir()
	require.NoError(t, os.WriteFile(img, nil, 0o600))
	require.NoError(t, os.Truncate(img, 64<<20))
	out, err := exec.Command("mke2fs", "-q", "-t", "ext4", "-F", img).CombinedOutput()
	require.NoError(t, err, "mke2fs: %s", out)

	var res struct {
		mountErr, err, checkpoint error
		synced, checkpointed      string
	}
	inMountNamespace(t, func() {
		if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
			res.mountErr = fmt.Errorf("%w: %s", err, out)
			return
		}
		defer unix.Unmount(dir, 0)
		if res.err = os.WriteFile(filepath.Join(dir, "written"), []byte("by a session\n"), 0o644); res.err != nil {
			return
		}
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if res.err = err; err != nil {
			return
		}
		defer unix.Close(fd)
		if res.err = unix.Syncfs(fd); res.err != nil {
			return
		}
		if res.synced, res.err = journalStart(img); res.err != nil {
			return
		}
		res.checkpoint = checkpointJournal(fd)
		res.checkpointed, res.err = journalStart(img)
	})
	if res.mountErr != nil {
		t.Skipf("cannot loop-mount an ext4 image here: %v", res.mountErr)
	}
	require.NoError(t, res.err)
	require.NoError(t, res.checkpoint)
	assert.NotEqual(t, "0", res.synced, "synced writes wait in the journal (the test's premise)")
	assert.Equal(t, "0", res.checkpointed, "the journal after checkpointJournal")
}

// journalStart is the "Journal start" dumpe2fs reads in the ext4 image
// img's journal superblock: "0" when the journal is empty.
func journalStart(img string) (string, error) {
	out, err := exec.Command("dumpe2fs", "-h", img).Output()
	if err != nil {
		return "", fmt.Errorf("dumpe2fs: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "Journal start:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("dumpe2fs printed no journal start: %s", out)
}
