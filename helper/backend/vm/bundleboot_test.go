package vm

import (
	"crypto/sha256"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

// writeBareExt4 writes a bare ext4 image of size bytes (1 KiB blocks, no
// checksum) labelled label at dir/name: a superblock and zeros.
func writeBareExt4(t *testing.T, dir, name, label string, size int64) string {
	t.Helper()
	sb := make([]byte, 1024)
	le := binary.LittleEndian
	le.PutUint32(sb[0x04:], uint32(size/1024)) // s_blocks_count_lo
	le.PutUint16(sb[0x38:], 0xEF53)            // s_magic
	copy(sb[0x68:], "0123456789abcdef")        // s_uuid
	copy(sb[0x78:0x88], label)                 // s_volume_name
	img := make([]byte, size)
	copy(img[1024:], sb)
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, img, 0o644))
	return path
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return sha256.Sum256(b)
}

// TestBundleLayerKeepsWritesAndLeavesTheImage: the root image is served
// through the profile's layer: what the guest writes is there at the next
// open, and the image's bytes never change.
func TestBundleLayerKeepsWritesAndLeavesTheImage(t *testing.T) {
	bundleDir, profile := t.TempDir(), t.TempDir()
	img := writeBareExt4(t, bundleDir, "rootfs.img", "cloudimg-rootfs", 1<<20)
	before := fileSum(t, img)
	var logs ratelogtest.LogBuffer
	bd, err := openBundleDisks(bundleDir, profile, logs.Logger())
	require.NoError(t, err)
	require.Len(t, bd.disks, 1)
	assert.Equal(t, RootImageSerial, bd.imageRoot().Serial)
	require.NoError(t, bd.disks[0].disk.WriteV([][]byte{[]byte(strings.Repeat("w", 512))}, 8192))
	require.NoError(t, bd.close())

	bd, err = openBundleDisks(bundleDir, profile, logs.Logger())
	require.NoError(t, err)
	got := make([]byte, 512)
	_, err = bd.disks[0].disk.ReadV([][]byte{got}, 8192)
	require.NoError(t, err)
	require.NoError(t, bd.close())
	assert.Equal(t, strings.Repeat("w", 512), string(got), "the write is in the profile's layer")
	assert.Equal(t, before, fileSum(t, img), "the image is never written")
	assert.Empty(t, logs.Lines("kept aside"))
}

// TestBundleLayerOfAnotherImageIsKeptAside: once the image changes (a new
// bundle), the old layer is renamed aside with its contents, logged, and
// the new image is served from a fresh layer without the old writes.
func TestBundleLayerOfAnotherImageIsKeptAside(t *testing.T) {
	bundleDir, profile := t.TempDir(), t.TempDir()
	writeBareExt4(t, bundleDir, "rootfs.img", "cloudimg-rootfs", 1<<20)
	var logs ratelogtest.LogBuffer
	bd, err := openBundleDisks(bundleDir, profile, logs.Logger())
	require.NoError(t, err)
	require.NoError(t, bd.disks[0].disk.WriteV([][]byte{[]byte(strings.Repeat("o", 512))}, 8192))
	require.NoError(t, bd.close())
	layer := filepath.Join(profile, BundleLayersDir, RootImageSerial+".cow")
	oldLayer := fileSum(t, layer)

	img := writeBareExt4(t, bundleDir, "rootfs.img", "cloudimg-rootfs", 2<<20) // a new bundle
	require.NoError(t, os.Chtimes(img, time.Now(), time.Now().Add(time.Hour)))
	bd, err = openBundleDisks(bundleDir, profile, logs.Logger())
	require.NoError(t, err)
	got := make([]byte, 512)
	_, err = bd.disks[0].disk.ReadV([][]byte{got}, 8192)
	require.NoError(t, err)
	require.NoError(t, bd.close())
	assert.Equal(t, make([]byte, 512), got, "the new image's bytes, not the old layer's")

	lines := logs.Lines("kept aside")
	require.Len(t, lines, 1)
	asides, err := filepath.Glob(layer + ".*.old")
	require.NoError(t, err)
	require.Len(t, asides, 1, "the old layer is kept, renamed")
	assert.Contains(t, lines[0], asides[0])
	assert.Equal(t, oldLayer, fileSum(t, asides[0]), "kept as it was, not merged")
}

// TestBundleFallbackReasons: a bundle that cannot be booted says why, and
// the guest falls back to the host's directories (openBundle is nil).
func TestBundleFallbackReasons(t *testing.T) {
	notExt4 := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(notExt4, "rootfs.img"), make([]byte, 1<<20), 0o644))
	for _, tc := range []struct {
		name, dir, profile, reason string
	}{
		{"no image", t.TempDir(), t.TempDir(), "no rootfs.img"},
		{"not an image", notExt4, t.TempDir(), "not a disk image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs ratelogtest.LogBuffer
			b := New(Options{Logger: logs.Logger()})
			assert.Nil(t, b.openBundle(tc.dir, tc.profile))
			lines := logs.Lines("VM bundle is not booted")
			require.Len(t, lines, 1)
			assert.Contains(t, lines[0], tc.reason)
		})
	}
	var logs ratelogtest.LogBuffer
	assert.Nil(t, New(Options{Logger: logs.Logger()}).openBundle("", t.TempDir()), "no bundlePath")
	assert.Empty(t, logs.Lines("bundle"), "nothing to say without a bundle")
}

// TestBundleWithoutStateHasAThrowawayLayer: a helper that keeps no state
// (cowork-vmm run) boots the bundle with a layer in a temporary directory,
// gone when the guest stops; the image is not written.
func TestBundleWithoutStateHasAThrowawayLayer(t *testing.T) {
	bundleDir := t.TempDir()
	img := writeBareExt4(t, bundleDir, "rootfs.img", "cloudimg-rootfs", 1<<20)
	before := fileSum(t, img)
	var logs ratelogtest.LogBuffer
	bd, err := openBundleDisks(bundleDir, "", logs.Logger())
	require.NoError(t, err)
	require.NotEmpty(t, bd.throwaway)
	assert.FileExists(t, filepath.Join(bd.throwaway, RootImageSerial+".cow"))
	require.NoError(t, bd.disks[0].disk.WriteV([][]byte{[]byte(strings.Repeat("w", 512))}, 8192))
	require.NoError(t, bd.close())
	assert.NoDirExists(t, bd.throwaway)
	assert.Equal(t, before, fileSum(t, img))
}

// TestBundleOtherImagesGetDisksByLabel: another ext4 image of the bundle
// gets a disk of its own, its serial derived from its label, with a layer
// of its own.
func TestBundleOtherImagesGetDisksByLabel(t *testing.T) {
	bundleDir, profile := t.TempDir(), t.TempDir()
	writeBareExt4(t, bundleDir, "rootfs.img", "cloudimg-rootfs", 1<<20)
	writeBareExt4(t, bundleDir, "data.img", "cowork data!", 1<<20)
	var logs ratelogtest.LogBuffer
	bd, err := openBundleDisks(bundleDir, profile, logs.Logger())
	require.NoError(t, err)
	defer bd.close()
	r := bd.imageRoot()
	require.Len(t, r.Images, 1)
	assert.Equal(t, "cwimg-coworkdata", r.Images[0].Serial)
	assert.Equal(t, "cowork data!", r.Images[0].Label)
	assert.FileExists(t, filepath.Join(profile, BundleLayersDir, "cwimg-coworkdata.cow"))
}

func TestImageSerial(t *testing.T) {
	for label, want := range map[string]string{
		"cowork-data":                "cwimg-cowork-data",
		"a/b c":                      "cwimg-abc",
		"averyveryverylonglabelname": "cwimg-averyveryveryl",
		"é":                          "",
		"":                           "",
	} {
		got, ok := imageSerial(label)
		assert.Equal(t, want, got, label)
		assert.Equal(t, want != "", ok, label)
		assert.LessOrEqual(t, len(got), 20)
	}
}

// TestBundleLayerInUseFallsBack: a layer locked by another VM of the
// profile is not shared: the bundle is not booted.
func TestBundleLayerInUseFallsBack(t *testing.T) {
	bundleDir, profile := t.TempDir(), t.TempDir()
	writeBareExt4(t, bundleDir, "rootfs.img", "cloudimg-rootfs", 1<<20)
	var logs ratelogtest.LogBuffer
	bd, err := openBundleDisks(bundleDir, profile, logs.Logger())
	require.NoError(t, err)
	defer bd.close()
	_, err = openBundleDisks(bundleDir, profile, logs.Logger())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "in use")
}

// TestOpenBundleRecordsTheSource: the bundle the client passed is kept in
// the profile's layer directory for doctor, also when it cannot be booted.
func TestOpenBundleRecordsTheSource(t *testing.T) {
	profile, missing := t.TempDir(), filepath.Join(t.TempDir(), "gone")
	var logs ratelogtest.LogBuffer
	assert.Nil(t, New(Options{Logger: logs.Logger()}).openBundle(missing, profile))
	got, err := os.ReadFile(filepath.Join(profile, BundleLayersDir, BundleSourceFile))
	require.NoError(t, err)
	assert.Equal(t, missing, string(got))
	ok, why := DescribeBundle(missing)
	assert.False(t, ok)
	assert.Contains(t, why, "no rootfs.img")
}
