package cow

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The test base: a partition that starts neither at 0 nor on a cluster,
// and ends in a short cluster, inside a larger image.
const (
	testImageSize   = 6 << 20
	testBaseOffset  = 1<<20 + 3*512
	testBaseLength  = 3<<20 + 5*512
	testIdentity    = "sha256:test-image/p1"
	testClusters    = (testBaseLength + ClusterSize - 1) / ClusterSize
	testLastCluster = testClusters - 1
)

// pattern is n pseudo-random bytes that differ with seed: no sector of
// one pattern equals another's, or zeros. (ChaCha8 fills fast, where a
// byte loop under the race detector takes seconds per image.)
func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{seed, 0xc0, 0x3}).Read(p)
	return p
}

// fixture is a base image and an overlay path in a temporary directory.
type fixture struct {
	t           *testing.T
	imagePath   string
	overlayPath string
	image       []byte // the whole image as written
	length      int64  // the base region's length
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newSizedFixture(t, testImageSize, testBaseLength)
}

// newSizedFixture is a fixture with an image of imageSize bytes and a
// base of length at testBaseOffset.
func newSizedFixture(t *testing.T, imageSize int, length int64) *fixture {
	t.Helper()
	dir := t.TempDir()
	fx := &fixture{t: t, imagePath: filepath.Join(dir, "rootfs.img"), overlayPath: filepath.Join(dir, "root.cow"),
		image: pattern(imageSize, 0x5a), length: length}
	require.NoError(t, os.WriteFile(fx.imagePath, fx.image, 0o444))
	return fx
}

// baseBytes is the base region as the image holds it.
func (fx *fixture) baseBytes() []byte {
	return append([]byte(nil), fx.image[testBaseOffset:testBaseOffset+fx.length]...)
}

// imageSum is the SHA-256 of the image file now.
func (fx *fixture) imageSum() [32]byte {
	fx.t.Helper()
	b, err := os.ReadFile(fx.imagePath)
	require.NoError(fx.t, err)
	return sha256.Sum256(b)
}

// base opens the image read-only, as the caller must, for a Base.
func (fx *fixture) base(identity string, length int64) Base {
	fx.t.Helper()
	f, err := os.Open(fx.imagePath)
	require.NoError(fx.t, err)
	fx.t.Cleanup(func() { _ = f.Close() })
	return Base{File: f, Offset: testBaseOffset, Length: length, Identity: identity}
}

// openOverlay opens (creating) the overlay file.
func (fx *fixture) openOverlay() *os.File {
	fx.t.Helper()
	f, err := os.OpenFile(fx.overlayPath, os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(fx.t, err)
	fx.t.Cleanup(func() { _ = f.Close() })
	return f
}

// tryOpen opens a Disk over the test base with identity and length.
func (fx *fixture) tryOpen(identity string, length int64) (*Disk, error) {
	return Open(fx.base(identity, length), fx.openOverlay())
}

// open opens a Disk over the test base, failing the test on error.
func (fx *fixture) open() *Disk {
	fx.t.Helper()
	d, err := fx.tryOpen(testIdentity, fx.length)
	require.NoError(fx.t, err)
	return d
}

// split cuts data into buffers of at most n bytes, as guest segments.
func split(data []byte, n int) [][]byte {
	var iov [][]byte
	for len(data) > 0 {
		k := min(n, len(data))
		iov = append(iov, data[:k])
		data = data[k:]
	}
	return iov
}

// readAt reads n bytes at off through ReadV in 3000-byte buffers, so
// that buffers straddle runs.
func readAt(t *testing.T, d *Disk, off int64, n int) []byte {
	t.Helper()
	got := make([]byte, n)
	done, err := d.ReadV(split(got, 3000), off)
	require.NoError(t, err)
	require.Equal(t, n, done)
	return got
}

// writeAt writes data at off through WriteV in 1000-byte buffers.
func writeAt(t *testing.T, d *Disk, off int64, data []byte) {
	t.Helper()
	require.NoError(t, d.WriteV(split(data, 1000), off))
}

// requireContent checks the whole disk reads as want.
func requireContent(t *testing.T, d *Disk, want []byte, msg string) {
	t.Helper()
	got := readAt(t, d, 0, len(want))
	if bytes.Equal(got, want) {
		return
	}
	if i := firstDiff(got, want); i >= 0 {
		require.Failf(t, "content differs", "%s: first at byte %d (cluster %d): got %#x, want %#x", msg, i, i/ClusterSize, got[i], want[i])
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
