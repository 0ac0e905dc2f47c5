package bundle

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCopySparseKeepsContentsAndHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	// 3 MiB + 5 bytes: a data chunk, a hole, a data chunk, a short tail.
	content := make([]byte, 3<<20+5)
	copy(content, "head")
	copy(content[2<<20:], "middle")
	copy(content[3<<20:], "tail!")
	require.NoError(t, os.WriteFile(src, content, 0o644))

	dst := filepath.Join(dir, "dst")
	require.NoError(t, copySparse(src, dst))
	got, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(content, got), "contents differ")
	if blocks := allocatedBytes(t, dst); blocks >= int64(len(content)) {
		t.Errorf("dst allocates %d bytes of %d: no hole", blocks, len(content))
	}
}

func TestCopyRangeSparseShiftsTheRange(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	require.NoError(t, err)
	// Data at 0 and at 5 MiB, a hole between (made by WriteAt past it).
	_, err = f.WriteAt([]byte("before"), 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("inside"), 5<<20)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(8<<20))
	require.NoError(t, f.Close())

	dst := filepath.Join(dir, "dst")
	require.NoError(t, copyRangeSparse(src, dst, 4<<20, 2<<20))
	got, err := os.ReadFile(dst)
	require.NoError(t, err)
	want := make([]byte, 2<<20)
	copy(want[1<<20:], "inside")
	assert.True(t, bytes.Equal(want, got), "the range's contents, shifted to 0")
}

func TestDirtyJournalCopyNeedsRecoveryAndReplaysTheMarker(t *testing.T) {
	b := Require(t)
	for _, tool := range []string{"sfdisk", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is needed: %v", tool, err)
		}
	}
	// Any write moves the mtime (ns on ext4); hashing 1.1 GiB twice took
	// 27 s here.
	before, err := os.Stat(b.RootImagePath())
	require.NoError(t, err)
	c, err := b.DirtyJournalCopy(t.TempDir())
	require.NoError(t, err)
	after, err := os.Stat(b.RootImagePath())
	require.NoError(t, err)
	assert.Equal(t, before.ModTime(), after.ModTime(), "the bundle itself was written")

	image := c.RootImagePath()
	_, parts := requirePartitions(t, image)
	offset := parts[RootPartition].Start
	f, err := os.Open(image)
	require.NoError(t, err)
	defer f.Close()
	sb, err := readExt4Superblock(f, offset)
	require.NoError(t, err)
	assert.NotZero(t, sb.Incompat&incompatRecover, "needs_recovery")
	assert.Equal(t, Marker+"\n", cat(t, image, offset, MarkerPath), "before the journal is replayed")

	// e2fsck replays the journal as the guest kernel's mount would; on the
	// partition alone, as e2fsck (and debugfs's journal_run) lose the
	// ?offset= when they reopen the filesystem after replaying.
	part := filepath.Join(t.TempDir(), "root.ext4")
	require.NoError(t, copyRangeSparse(image, part, offset, parts[RootPartition].Size))
	out, err := exec.Command("e2fsck", "-fy", part).CombinedOutput()
	require.NoError(t, err, "e2fsck: %s", out)
	assert.Contains(t, string(out), "recovering journal")
	image, offset = part, 0
	assert.Equal(t, JournaledMarker+"\n", cat(t, image, offset, MarkerPath), "after")
}
