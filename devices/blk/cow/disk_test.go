package cow

import (
	"errors"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestUntouchedClustersReadTheBase(t *testing.T) {
	fx := newFixture(t)
	d := fx.open()
	require.EqualValues(t, testBaseLength, d.Size())
	requireContent(t, d, fx.baseBytes(), "fresh overlay")
	// A write elsewhere leaves the rest reading the base.
	writeAt(t, d, 5*ClusterSize, pattern(ClusterSize, 1))
	want := fx.baseBytes()
	copy(want[5*ClusterSize:], pattern(ClusterSize, 1))
	requireContent(t, d, want, "after one cluster written")
}

func TestPartialWritesMergeWithTheBase(t *testing.T) {
	fx := newFixture(t)
	d := fx.open()
	want := fx.baseBytes()
	for _, w := range []struct{ off, n int64 }{
		{3*ClusterSize + 1024, 512},                  // inside one cluster
		{7*ClusterSize - 4096, 3*ClusterSize + 8192}, // tail, two whole, head
		{testBaseLength - 1024, 1024},                // in the short last cluster
		{3*ClusterSize + 4096, 512},                  // again into a Present cluster
	} {
		data := pattern(int(w.n), byte(w.off))
		writeAt(t, d, w.off, data)
		copy(want[w.off:], data)
		requireContent(t, d, want, "after a partial write")
	}
	// The short last cluster was copied up whole, and nothing past it.
	require.Equal(t, byte(statePresent), d.state(testLastCluster))
}

func TestWritesNeverReachTheBase(t *testing.T) {
	fx := newFixture(t)
	before := fx.imageSum()
	d := fx.open()
	want := fx.baseBytes()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		off := rng.Int64N(testBaseLength/512) * 512
		n := min(rng.Int64N(3*ClusterSize/512+1)*512+512, testBaseLength-off)
		switch rng.IntN(10) {
		case 0:
			require.NoError(t, d.WriteZeroes(off, n, rng.IntN(2) == 0))
			clear(want[off : off+n])
		case 1:
			require.NoError(t, d.Flush())
		default:
			data := pattern(int(n), byte(i))
			writeAt(t, d, off, data)
			copy(want[off:], data)
		}
	}
	requireContent(t, d, want, "after a write-heavy session")
	require.NoError(t, d.Close())
	require.Equal(t, before, fx.imageSum(), "the base image changed")
}

// The client's image is opened read-only: a writable descriptor is
// refused, so no bug can ever write through it.
func TestBaseOpenForWritingIsRefused(t *testing.T) {
	fx := newFixture(t)
	require.NoError(t, os.Chmod(fx.imagePath, 0o644))
	f, err := os.OpenFile(fx.imagePath, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = Open(Base{File: f, Offset: testBaseOffset, Length: testBaseLength, Identity: testIdentity}, fx.openOverlay())
	require.ErrorContains(t, err, "open for writing")
}

// An overlay that is the image itself (another descriptor, a hard link)
// is refused before anything is written: an image whose head is zeros
// would otherwise pass for an overlay never committed, and be laid out
// afresh (truncated).
func TestOverlayThatIsTheBaseIsRefused(t *testing.T) {
	fx := newFixture(t)
	clear(fx.image[:ClusterSize])
	require.NoError(t, os.Chmod(fx.imagePath, 0o644))
	require.NoError(t, os.WriteFile(fx.imagePath, fx.image, 0o644))
	before := fx.imageSum()
	link := fx.imagePath + ".link"
	require.NoError(t, os.Link(fx.imagePath, link))
	f, err := os.OpenFile(link, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = Open(fx.base(testIdentity, testBaseLength), f)
	require.ErrorContains(t, err, "is the base image")
	require.Equal(t, before, fx.imageSum())
}

func TestBadBaseRegions(t *testing.T) {
	fx := newFixture(t)
	for _, tc := range []struct {
		name        string
		off, length int64
		identity    string
		want        string
	}{
		{"past the end", testImageSize - 512, 1024, testIdentity, "runs past the end"},
		{"offset past the end", testImageSize + 512, 512, testIdentity, "runs past the end"},
		{"unaligned offset", 100, 512, testIdentity, "sectors"},
		{"negative offset", -512, 512, testIdentity, "sectors"},
		{"unaligned length", 0, 1000, testIdentity, "multiple"},
		{"empty", 0, 0, testIdentity, "positive"},
		{"too big", 0, MaxBaseSize + 512, testIdentity, "up to"},
		{"no identity", 0, 512, "", "identity"},
		{"long identity", 0, 512, string(make([]byte, MaxIdentity+1)), "identity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := fx.base(tc.identity, tc.length)
			b.Offset = tc.off
			_, err := Open(b, fx.openOverlay())
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestPersistsAcrossCloseAndReopen(t *testing.T) {
	fx := newFixture(t)
	d := fx.open()
	require.EqualValues(t, 1, d.Generation())
	want := fx.baseBytes()
	writeAt(t, d, ClusterSize+512, pattern(3*ClusterSize, 9))
	copy(want[ClusterSize+512:], pattern(3*ClusterSize, 9))
	require.NoError(t, d.WriteZeroes(10*ClusterSize, 2*ClusterSize, true))
	clear(want[10*ClusterSize : 12*ClusterSize])
	require.NoError(t, d.Close())
	require.ErrorIs(t, d.Flush(), ErrClosed)
	_, err := d.ReadV([][]byte{make([]byte, 512)}, 0)
	require.ErrorIs(t, err, ErrClosed)

	d = fx.open()
	require.EqualValues(t, 2, d.Generation(), "the close committed one generation")
	requireContent(t, d, want, "after reopening")
	// A flush with no change to the map commits no generation.
	writeAt(t, d, ClusterSize+512, pattern(512, 3))
	copy(want[ClusterSize+512:], pattern(512, 3))
	require.NoError(t, d.Flush())
	require.EqualValues(t, 2, d.Generation())
	// The next goes to the other slot; reopening takes the newest.
	writeAt(t, d, 20*ClusterSize, pattern(512, 4))
	copy(want[20*ClusterSize:], pattern(512, 4))
	require.NoError(t, d.Close())
	d = fx.open()
	require.EqualValues(t, 3, d.Generation())
	requireContent(t, d, want, "after the second reopening")
}

func TestOverlayOfAnotherBaseIsRefused(t *testing.T) {
	fx := newFixture(t)
	d := fx.open()
	writeAt(t, d, 0, pattern(512, 1))
	require.NoError(t, d.Close())
	before, err := os.ReadFile(fx.overlayPath)
	require.NoError(t, err)

	_, err = fx.tryOpen("sha256:another-image/p1", testBaseLength)
	require.ErrorIs(t, err, ErrMismatch)
	require.ErrorContains(t, err, `made for base "sha256:test-image/p1"`)
	_, err = fx.tryOpen(testIdentity, testBaseLength-512)
	require.ErrorIs(t, err, ErrMismatch)
	require.ErrorContains(t, err, "made for a base of 3148288 bytes")
	_, err = fx.tryOpen(testIdentity, testBaseLength+ClusterSize)
	require.ErrorIs(t, err, ErrMismatch, "a bigger base is a mismatch too")

	after, err := os.ReadFile(fx.overlayPath)
	require.NoError(t, err)
	require.Equal(t, before, after, "a refused overlay was changed")
	_ = fx.open() // and the right base still opens it
}

// flipByte changes one byte of the overlay file.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, off)
	require.NoError(t, err)
	b[0] ^= 0x40
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
}

func TestCorruptMapIsRefusedNotReset(t *testing.T) {
	fx := newFixture(t)
	d := fx.open()
	writeAt(t, d, 0, pattern(512, 1))
	require.NoError(t, d.Close()) // generation 2 in slot 0, 1 in slot 1
	l, err := layoutFor(testBaseLength)
	require.NoError(t, err)

	// One slot corrupt: the other is taken.
	flipByte(t, fx.overlayPath, headerSize+1) // slot 0's bitmap
	d = fx.open()
	require.EqualValues(t, 1, d.Generation())
	require.NoError(t, d.Close())

	// Both corrupt: refused, and the file kept.
	flipByte(t, fx.overlayPath, l.slotSize+hdrGeneration)
	info, err := os.Stat(fx.overlayPath)
	require.NoError(t, err)
	_, err = fx.tryOpen(testIdentity, testBaseLength)
	require.ErrorContains(t, err, "no valid map slot")
	require.NotErrorIs(t, err, ErrMismatch)
	after, err := os.Stat(fx.overlayPath)
	require.NoError(t, err)
	require.Equal(t, info.Size(), after.Size())
}

// An overlay whose first commit was cut short (slot 1 begun, slot 0 never
// written) committed nothing and is laid out afresh; a foreign file whose
// first page is zeros is not.
func TestInterruptedFirstCommitStartsAfresh(t *testing.T) {
	fx := newFixture(t)
	l, err := layoutFor(testBaseLength)
	require.NoError(t, err)
	torn := make([]byte, l.fileSize())
	copy(torn[l.slotSize:], magic[:])
	copy(torn[l.dataOffset:], "junk the first commit never named")
	require.NoError(t, os.WriteFile(fx.overlayPath, torn, 0o600))
	d := fx.open()
	require.EqualValues(t, 1, d.Generation())
	requireContent(t, d, fx.baseBytes(), "a fresh overlay")

	foreign := make([]byte, l.fileSize())
	copy(foreign[l.slotSize:], "some disk image")
	require.NoError(t, os.WriteFile(fx.overlayPath, foreign, 0o600))
	_, err = fx.tryOpen(testIdentity, testBaseLength)
	require.ErrorContains(t, err, "no valid map slot")
	kept, err := os.ReadFile(fx.overlayPath)
	require.NoError(t, err)
	require.Equal(t, foreign, kept)

	// A file with a head of zeros but not an overlay's size: not ours.
	zeroHead := make([]byte, l.fileSize()+ClusterSize)
	copy(zeroHead[l.dataOffset:], "a never-formatted disk's data")
	require.NoError(t, os.WriteFile(fx.overlayPath, zeroHead, 0o600))
	_, err = fx.tryOpen(testIdentity, testBaseLength)
	require.ErrorContains(t, err, "not an overlay")
	kept, err = os.ReadFile(fx.overlayPath)
	require.NoError(t, err)
	require.Equal(t, zeroHead, kept)
}

// dataAt reports whether the overlay holds allocated data in the range.
func dataAt(t *testing.T, path string, off, size int64) bool {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	next, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return false
	}
	require.NoError(t, err)
	return next < off+size
}

func TestDiscardAndWriteZeroes(t *testing.T) {
	fx := newFixture(t)
	d := fx.open()
	want := fx.baseBytes()
	l := d.l
	// Present clusters 0-3.
	writeAt(t, d, 0, pattern(4*ClusterSize, 1))
	copy(want, pattern(4*ClusterSize, 1))

	// Discard whole clusters, Present (1) and Base (6): zeros, never the
	// base's bytes, and the overlay's copy punched.
	require.NoError(t, d.Discard(ClusterSize, ClusterSize))
	require.NoError(t, d.Discard(6*ClusterSize, ClusterSize))
	clear(want[ClusterSize : 2*ClusterSize])
	clear(want[6*ClusterSize : 7*ClusterSize])
	require.Equal(t, byte(stateZero), d.state(1))
	require.Equal(t, byte(stateZero), d.state(6))
	require.NoError(t, d.Flush())
	require.False(t, dataAt(t, fx.overlayPath, l.dataOffset+ClusterSize, ClusterSize), "discarded cluster still allocated")
	// A partial discard of a Base cluster leaves it (advisory).
	require.NoError(t, d.Discard(8*ClusterSize+4096, 8192))
	requireContent(t, d, want, "after discards")

	// Write-zeroes over part of a Base cluster: zeros there, base around.
	require.NoError(t, d.WriteZeroes(9*ClusterSize+512, 1024, false))
	clear(want[9*ClusterSize+512 : 9*ClusterSize+1536])
	// Over part of a Present cluster, and over a Present cluster whole
	// without unmap (zeroed in place) and with it (punched).
	require.NoError(t, d.WriteZeroes(2*ClusterSize+4096, 4096, true))
	clear(want[2*ClusterSize+4096 : 2*ClusterSize+8192])
	require.NoError(t, d.WriteZeroes(3*ClusterSize, ClusterSize, false))
	clear(want[3*ClusterSize : 4*ClusterSize])
	require.Equal(t, byte(statePresent), d.state(3))
	require.NoError(t, d.WriteZeroes(0, ClusterSize, true))
	clear(want[:ClusterSize])
	require.Equal(t, byte(stateZero), d.state(0))
	// Write-zeroes over a whole Base cluster, and the short last one.
	require.NoError(t, d.WriteZeroes(12*ClusterSize, ClusterSize, false))
	clear(want[12*ClusterSize : 13*ClusterSize])
	lastStart := int64(testLastCluster * ClusterSize)
	require.NoError(t, d.WriteZeroes(lastStart, testBaseLength-lastStart, true))
	clear(want[lastStart:])
	require.Equal(t, byte(stateZero), d.state(testLastCluster))
	requireContent(t, d, want, "after write-zeroes")

	// A partial write into a Zero cluster merges with zeros, not the base.
	writeAt(t, d, 6*ClusterSize+1024, pattern(512, 7))
	copy(want[6*ClusterSize+1024:], pattern(512, 7))
	requireContent(t, d, want, "after writing into a Zero cluster")

	require.NoError(t, d.Close())
	requireContent(t, fx.open(), want, "after reopening")
}

func TestOutOfRangeIsRefused(t *testing.T) {
	fx := newFixture(t)
	d := fx.open()
	buf := make([]byte, 1024)
	for _, off := range []int64{-512, testBaseLength - 512, testBaseLength, 1 << 62} {
		_, err := d.ReadV([][]byte{buf}, off)
		require.ErrorContains(t, err, "outside the disk", "read at %d", off)
		require.ErrorContains(t, d.WriteV([][]byte{buf}, off), "outside the disk", "write at %d", off)
		require.ErrorContains(t, d.Discard(off, 1024), "outside the disk")
		require.ErrorContains(t, d.WriteZeroes(off, 1024, true), "outside the disk")
	}
	require.ErrorContains(t, d.Discard(0, -1), "outside the disk")
	requireContent(t, d, fx.baseBytes(), "after refused requests")
}
