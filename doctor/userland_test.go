package doctor

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/helper/backend/vm"
)

// writeBundle makes dir a bundle whose rootfs.img is a bare ext4
// filesystem labelled cloudimg-rootfs (a superblock and zeros).
func writeBundle(t *testing.T, dir string) {
	t.Helper()
	img := make([]byte, 1<<20)
	sb := img[1024:]
	binary.LittleEndian.PutUint32(sb[0x04:], 1024) // blocks of 1 KiB
	binary.LittleEndian.PutUint16(sb[0x38:], 0xEF53)
	copy(sb[0x78:], "cloudimg-rootfs")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rootfs.img"), img, 0o644))
}

// layerDir makes the profile's bundle layer directory, with source (the
// bundle last passed) when it is not "".
func layerDir(t *testing.T, data, profile, source string) string {
	t.Helper()
	dir := filepath.Join(data, "profiles", profile, vm.BundleLayersDir)
	require.NoError(t, os.MkdirAll(dir, 0o700))
	if source != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, vm.BundleSourceFile), []byte(source), 0o600))
	}
	return dir
}

func runUserland(t *testing.T, data string) Report {
	t.Helper()
	h := healthyHost().host()
	h.DataDir = func() (string, error) { return data, nil }
	h.Userlands = ListUserlands
	return Run(context.Background(), Options{Host: h})
}

// TestUserlandCheckSaysWhichAndWhy: a profile whose bundle can be booted
// gets its image, with the rule that chose the root; one whose bundle
// cannot falls back to the host's directories, with why (a warning);
// one that started without a bundle is not listed; layers kept aside
// are counted.
func TestUserlandCheckSaysWhichAndWhy(t *testing.T) {
	data := t.TempDir()
	good, gone := filepath.Join(t.TempDir(), "bundle"), filepath.Join(t.TempDir(), "missing")
	writeBundle(t, good)
	aside := layerDir(t, data, profileA, good)
	require.NoError(t, os.WriteFile(filepath.Join(aside, "cowork-image-root.cow.20261206T101010.000000000Z.old"), nil, 0o600))
	layerDir(t, data, profileB, gone)
	require.NoError(t, os.MkdirAll(filepath.Join(data, "profiles", "no-bundle-0", "sessions"), 0o700))

	lands, err := ListUserlands(data)
	require.NoError(t, err)
	require.Len(t, lands, 2)
	assert.True(t, lands[0].Image)
	assert.Equal(t, good, lands[0].Bundle)
	assert.Equal(t, 1, lands[0].Aside)
	wantContains(t, "why", lands[0].Why, filepath.Join(good, "rootfs.img"), "cloudimg-rootfs")
	assert.False(t, lands[1].Image)
	wantContains(t, "why", lands[1].Why, "host's system directories", "no rootfs.img")

	c := wantStatus(t, runUserland(t, data), CheckUserland, StatusWarn)
	wantContains(t, "detail", c.Detail, profileA+": the bundle's image", "1 layer(s) over an older image kept aside",
		profileB+": the host's system directories")
	assert.NotContains(t, c.Detail, "no-bundle-0")
}

// TestUserlandCheckNone: no profile started on a bundle is no failure.
func TestUserlandCheckNone(t *testing.T) {
	c := wantStatus(t, runUserland(t, t.TempDir()), CheckUserland, StatusOK)
	assert.Contains(t, c.Detail, "no profile has started on a bundle yet")
}
