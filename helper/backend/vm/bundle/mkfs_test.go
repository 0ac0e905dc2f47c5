package bundle

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mkfsExt4 makes a real ext4 filesystem of sizeKiB at byte offset of the
// image at path, from the tree src, with label and uuid; it skips the test
// when mkfs.ext4 is not installed.
func mkfsExt4(t *testing.T, path string, offset, sizeKiB int64, label, uuid, src string) {
	t.Helper()
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Skip("mkfs.ext4 is not installed (e2fsprogs)")
	}
	cmd := exec.Command(mkfs, "-q", "-F", "-L", label, "-U", uuid, "-d", src,
		"-E", fmt.Sprintf("offset=%d,nodiscard", offset), path, fmt.Sprintf("%dk", sizeKiB))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// TestRealExt4InAGPTImage: the client's layout with partition 1 made by
// mkfs.ext4 (metadata_csum on, so the checksum code meets real data).
func TestRealExt4InAGPTImage(t *testing.T) {
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "marker"), []byte("from the image\n"), 0o644))
	dir := t.TempDir()
	g := testGPT{sectors: 16384, entries: 128, parts: []testPartition{
		{number: 14, typ: BIOSBoot, first: 34, last: 2047},
		{number: 15, typ: EFISystem, first: 2048, last: 4095},
		{number: 1, typ: LinuxFilesystem, first: 4096, last: 16000},
	}}
	path := writeImage(t, dir, RootImageName, g.build(t))
	const uuid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	mkfsExt4(t, path, 4096*SectorSize, (16000-4096+1)*SectorSize/1024, RootLabel, uuid, src)

	b, err := Read(dir)
	require.NoError(t, err)
	assert.Empty(t, b.RootImage.Problems)
	assert.Empty(t, b.RootImage.Table.Notes, "mkfs left the backup GPT alone")
	root := b.Root
	assert.Equal(t, 1, root.Partition.Number)
	assert.Equal(t, int64(4096*SectorSize), root.Offset())
	assert.Equal(t, RootLabel, root.FS.Label)
	assert.Equal(t, uuid, root.FS.UUID)
	assert.True(t, root.FS.HasJournal)
	assert.False(t, root.FS.NeedsRecovery)
	assert.NotZero(t, root.FS.ROCompat&ROCompatMetadataCsum, "mkfs.ext4's default has metadata_csum, so the checksum was checked")
	assert.LessOrEqual(t, root.FS.Bytes(), root.Length())
}

func TestRealBareExt4(t *testing.T) {
	dir := t.TempDir()
	path := writeImage(t, dir, RootImageName, make([]byte, 4<<20))
	mkfsExt4(t, path, 0, 4096, "conda", "11111111-2222-3333-4444-555555555555", t.TempDir())
	b, err := Read(dir)
	require.NoError(t, err)
	assert.Equal(t, TableNone, b.RootImage.Table.Kind)
	assert.Equal(t, "conda", b.Root.FS.Label)
	assert.Equal(t, int64(4<<20), b.Root.Length())
}
