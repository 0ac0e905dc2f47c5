package bundle

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// bareExt4 is a whole-file ext4 image of size bytes labelled label.
func bareExt4(label string, size int) []byte {
	disk := make([]byte, size)
	copy(disk[SuperblockOffset:], ext4SB(label, int64(size)).bytes())
	return disk
}

func TestReadBundle(t *testing.T) {
	dir := t.TempDir()
	writeImage(t, dir, RootImageName, cloudLayout(RootLabel).build(t))
	writeImage(t, dir, "conda.img", bareExt4("conda", 1<<20))
	writeImage(t, dir, "manifest.json", []byte(`{"files":["rootfs.img"]}`))
	writeImage(t, dir, "rootfs.img.zst", append([]byte{0x28, 0xb5, 0x2f, 0xfd}, make([]byte, 5000)...))
	broken := cloudLayout("data").build(t)
	broken[SectorSize+40] ^= 0xFF
	clear(broken[len(broken)-SectorSize:])
	writeImage(t, dir, "broken.img", broken)
	swapOnly := testGPT{sectors: 2048, entries: 4, parts: []testPartition{{number: 1, typ: LinuxSwap, first: 40, last: 2000}}}
	writeImage(t, dir, "swap.img", swapOnly.build(t))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "efivars"), 0o755))
	require.NoError(t, unix.Mkfifo(filepath.Join(dir, "a.fifo"), 0o600))
	require.NoError(t, os.Symlink("conda.img", filepath.Join(dir, "linked.img")))

	done := make(chan struct{})
	var b Bundle
	var err error
	go func() { b, err = Read(dir); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Read hung (on the FIFO?)")
	}
	require.NoError(t, err)
	assert.Equal(t, 1, b.Root.Partition.Number)
	assert.Equal(t, filepath.Join(dir, RootImageName), b.Root.Image)
	assert.NotEmpty(t, b.RootImage.Identity.String())

	var names, labels []string
	for _, img := range b.Others {
		names = append(names, filepath.Base(img.Path))
		labels = append(labels, img.Volumes[0].FS.Label)
	}
	assert.Equal(t, []string{"conda.img", "linked.img"}, names, "images with ext4, by name; non-images left out")
	assert.Equal(t, []string{"conda", "conda"}, labels)

	skipped := map[string]string{}
	for _, s := range b.Skipped {
		skipped[s.Name] = s.Reason
	}
	require.Len(t, skipped, 2, "%v", skipped)
	assert.Contains(t, skipped["broken.img"], "header CRC mismatch")
	assert.Contains(t, skipped["broken.img"], "no valid backup")
	assert.Contains(t, skipped["swap.img"], "no ext4 partition (GPT table with partitions 1 (Linux swap))")

	assert.Equal(t, []string{`label "conda" is on the whole file of conda.img, the whole file of linked.img`}, b.LabelClashes)

	summary := b.Summary()
	require.Len(t, summary, 6, "%q", summary)
	assert.Equal(t, `root: partition 1 of rootfs.img: ext4 labelled "cloudimg-rootfs"`, summary[0])
	assert.Equal(t, `image conda.img, the whole file: ext4 labelled "conda"`, summary[1])
	assert.Contains(t, summary[3], "skipped broken.img: ")
}

func TestReadBundleWithoutRootImage(t *testing.T) {
	dir := t.TempDir()
	writeImage(t, dir, "conda.img", bareExt4("conda", 1<<20))
	_, err := Read(dir)
	assert.True(t, errors.Is(err, ErrNoRootImage), "%v", err)
	_, err = Read(filepath.Join(dir, "absent"))
	assert.True(t, errors.Is(err, ErrNoRootImage), "%v", err)
}

func TestReadBundleRootErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	root := writeImage(t, dir, RootImageName, []byte("not an image at all, just text"))
	_, err := Read(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), root+": ")
	assert.True(t, errors.Is(err, ErrNotImage), "%v", err)

	require.NoError(t, os.Remove(root))
	require.NoError(t, os.Mkdir(root, 0o755))
	_, err = Read(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not a regular file")
}

// TestReadBundleUnreadableImage: a file that cannot be opened (here a
// symlink to nothing, which even root cannot read) is listed with the
// reason.
func TestReadBundleUnreadableImage(t *testing.T) {
	dir := t.TempDir()
	writeImage(t, dir, RootImageName, cloudLayout(RootLabel).build(t))
	require.NoError(t, os.Symlink("gone.img", filepath.Join(dir, "data.img")))
	b, err := Read(dir)
	require.NoError(t, err)
	require.Len(t, b.Skipped, 1)
	assert.Equal(t, "data.img", b.Skipped[0].Name)
	assert.Contains(t, b.Skipped[0].Reason, "no such file or directory")
}

func TestReadBundleBoundsTheListing(t *testing.T) {
	dir := t.TempDir()
	writeImage(t, dir, RootImageName, cloudLayout(RootLabel).build(t))
	for i := range maxBundleEntries + 10 {
		writeImage(t, dir, fmt.Sprintf("f%03d", i), []byte("x"))
	}
	b, err := Read(dir)
	require.NoError(t, err)
	require.Len(t, b.Skipped, 1)
	assert.Contains(t, b.Skipped[0].Reason, "more than 256 entries")
}

// TestOtherDiskFormatsAreNamed: a qcow2 or VHDX beside the root is listed
// as not raw; a compressed download is left out; a compressed root image
// is an error that says so.
func TestOtherDiskFormatsAreNamed(t *testing.T) {
	dir := t.TempDir()
	writeImage(t, dir, RootImageName, cloudLayout(RootLabel).build(t))
	writeImage(t, dir, "conda.qcow2", append([]byte("QFI\xfb\x00\x00\x00\x03"), make([]byte, 4096)...))
	writeImage(t, dir, "rootfs.vhdx", append([]byte("vhdxfile"), make([]byte, 4096)...))
	writeImage(t, dir, "conda.img.xz", append([]byte("\xfd7zXZ\x00"), make([]byte, 4096)...))
	b, err := Read(dir)
	require.NoError(t, err)
	require.Len(t, b.Skipped, 2, "%v", b.Skipped)
	assert.Equal(t, "conda.qcow2", b.Skipped[0].Name)
	assert.Contains(t, b.Skipped[0].Reason, "a qcow2 image, not a raw disk image")
	assert.Contains(t, b.Skipped[1].Reason, "a VHDX image, not a raw disk image")

	zst := t.TempDir()
	writeImage(t, zst, RootImageName, append([]byte{0x28, 0xb5, 0x2f, 0xfd}, make([]byte, 4096)...))
	_, err = Read(zst)
	require.ErrorIs(t, err, ErrNotImage)
	assert.Contains(t, err.Error(), "rootfs.img: not a disk image (no partition table, no ext4 filesystem): zstd-compressed")
}

// TestLabelClashWithTheRoot: an image beside the root that carries the
// root's label makes a mount by that label ambiguous, and says so.
func TestLabelClashWithTheRoot(t *testing.T) {
	dir := t.TempDir()
	writeImage(t, dir, RootImageName, cloudLayout(RootLabel).build(t))
	writeImage(t, dir, "data.img", bareExt4("data", 1<<20))
	b, err := Read(dir)
	require.NoError(t, err)
	assert.Empty(t, b.LabelClashes)
	writeImage(t, dir, "old-root.img", bareExt4(RootLabel, 1<<20))
	b, err = Read(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{`label "cloudimg-rootfs" is on partition 1 of rootfs.img, the whole file of old-root.img`}, b.LabelClashes)
}
