package vmm

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var sparseID = snapshot.Identity{Build: "test", Kernel: "test", MemoryBytes: 1, CPUs: 1}

// snapshotOf writes a snapshot holding m's RAM to a file (seekable) or a
// stream, through the sparse path or, with plain, as a plain reader (the
// way it was written before WriteSparse), and returns its bytes.
func snapshotOf(t testing.TB, m *Memory, seekable, plain bool) []byte {
	t.Helper()
	if !seekable {
		var buf bytes.Buffer
		require.NoError(t, writeMemorySnapshot(struct{ io.Writer }{&buf}, m, plain))
		return buf.Bytes()
	}
	path := snapshotFile(t, m, plain)
	sf, err := snapshot.Open(path, sparseID)
	require.NoError(t, err, "the checksum holds")
	sf.Close()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// writeMemorySnapshot writes a snapshot of m's RAM between two small
// sections to w.
func writeMemorySnapshot(w io.Writer, m *Memory, plain bool) error {
	data := m.Reader()
	if plain {
		data = struct{ io.Reader }{data}
	}
	return snapshot.Write(w, sparseID, []snapshot.Section{
		{Name: "vm", Size: 5, Data: bytes.NewReader([]byte("state"))},
		{Name: SectionMemory, Size: int64(m.Size()), Data: data},
		{Name: "devices", Size: 3, Data: bytes.NewReader([]byte("dev"))},
	})
}

// snapshotFile writes a snapshot of m's RAM to a new file, its path.
func snapshotFile(t testing.TB, m *Memory, plain bool) string {
	path := filepath.Join(t.TempDir(), "snap")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, writeMemorySnapshot(f, m, plain))
	require.NoError(t, f.Close())
	return path
}

// requireSameSnapshots checks that the sparse path writes what the plain
// path writes, into a file and into a stream.
func requireSameSnapshots(t *testing.T, m *Memory) {
	for _, seekable := range []bool{true, false} {
		plain := snapshotOf(t, m, seekable, true)
		sparse := snapshotOf(t, m, seekable, false)
		require.True(t, bytes.Equal(plain, sparse), "seekable %v: the sparse path wrote another file", seekable)
	}
}

// knownZeroPages returns which pages of m's first region WriteSparse
// would skip unread; it skips the test without a readable pagemap.
func knownZeroPages(t *testing.T, m *Memory) []bool {
	pagemap := openPagemap()
	if pagemap == nil {
		t.Skip("/proc/self/pagemap cannot be read here")
	}
	defer pagemap.Close()
	var image *imageData
	if m.image != nil {
		image = m.image.data()
	}
	r := m.regions[0]
	zero := make([]bool, len(r.host)/pageSize)
	buf := make([]byte, 8*pagemapChunk)
	for first := 0; first < len(zero); first += pagemapChunk {
		knownZero(pagemap, image, r, first, zero[first:min(first+pagemapChunk, len(zero))], buf)
	}
	return zero
}

func TestSparseSnapshotOfAnonymousRAMIsTheSame(t *testing.T) {
	m, err := NewMemory([]MemoryRegion{{GPA: 0, Size: 64 << 20}, {GPA: 1 << 32, Size: 2 << 20}})
	require.NoError(t, err)
	defer m.Close()
	for _, gpa := range []uint64{0, 5 * pageSize, 3<<20 + 17, 64<<20 - 16, 1 << 32} {
		require.NoError(t, m.WriteAt([]byte("guest data"), gpa))
	}
	require.NoError(t, m.WriteAt(make([]byte, pageSize), 9*pageSize)) // written, zeros
	require.NoError(t, m.WriteAt(bytes.Repeat([]byte{7}, 4*pageSize), 32<<20))
	_, err = m.Discard(32<<20, 4*pageSize)
	require.NoError(t, err)

	zero := knownZeroPages(t, m)
	require.False(t, zero[0], "a written page is read")
	require.False(t, zero[9], "a page written with zeros is read (blockWriter drops it)")
	require.True(t, zero[(10<<20)/pageSize], "an untouched page is skipped")
	require.True(t, zero[(32<<20)/pageSize+1], "a discarded page is no longer present: skipped")
	requireSameSnapshots(t, m)
}

func TestSparseSnapshotOfImageRAMIsTheSame(t *testing.T) {
	const offset, size = 8192, 16 << 20
	f := imageFile(t, offset, size, map[int64][]byte{
		0:          []byte("image page 0"),
		3 * 4096:   bytes.Repeat([]byte{1}, 3*4096),
		5<<20 + 99: []byte("read only"),
		8 << 20:    []byte("overwritten"),
		size - 4:   []byte("last"),
	})
	m, err := NewMemoryFromImage([]MemoryRegion{{GPA: 0, Size: 8 << 20}, {GPA: 1 << 32, Size: 8 << 20}}, MemoryImage{FD: int(f.Fd()), Offset: offset})
	require.NoError(t, err)
	f.Close()
	defer m.Close()
	require.NoError(t, m.ReadAt(make([]byte, 20), 5<<20+90))                // mapped from the file
	require.NoError(t, m.WriteAt([]byte("copy on write"), 1<<32))           // over image data
	require.NoError(t, m.WriteAt([]byte("into a hole"), 7<<20))             // over an image hole
	require.NoError(t, m.WriteAt(bytes.Repeat([]byte{9}, pageSize), 2<<20)) // then discarded:
	_, err = m.Discard(2<<20, pageSize)                                     // the image's zeros again
	require.NoError(t, err)
	require.NoError(t, m.WriteAt([]byte("cow then discarded"), 4*pageSize))
	_, err = m.Discard(4*pageSize, pageSize) // the image's data again
	require.NoError(t, err)

	zero := knownZeroPages(t, m)
	require.False(t, zero[0], "an untouched page of image data is read")
	require.False(t, zero[4], "a discarded page of image data is read")
	require.True(t, zero[1], "an untouched page of an image hole is skipped")
	// On a tmpfs the write's fault gave the hole a page of the file's own
	// (tmpfsShort's doc): it is data now, read and written as zeros. The
	// snapshot is the same either way.
	var fs unix.Statfs_t
	require.NoError(t, unix.Statfs(f.Name(), &fs))
	onTmpfs := fs.Type == unix.TMPFS_MAGIC
	require.Equal(t, !onTmpfs, zero[(2<<20)/pageSize], "a discarded page of an image hole is skipped, but on a tmpfs (tmpfs: %v)", onTmpfs)
	requireSameSnapshots(t, m)
	require.NoError(t, m.Close())
	require.Equal(t, -1, m.image.fd, "Close closes the image descriptor Memory kept")
}

// An image with more data extents than are recorded is read past them.
func TestImageDataBeyondTheBoundIsData(t *testing.T) {
	data := map[int64][]byte{}
	for i := range int64(maxImageExtents + 10) {
		data[2*i*pageSize] = []byte{1}
	}
	size := int64(2*(maxImageExtents+20)) * pageSize
	f := imageFile(t, 0, size, data)
	d := scanImageData(int(f.Fd()), 0, size)
	require.Len(t, d.extents, maxImageExtents)
	require.True(t, d.hole(pageSize, pageSize), "a hole among the recorded extents")
	require.False(t, d.hole(size-pageSize, pageSize), "past the recorded extents all is data")
}

// minorFaults returns this thread's minor page faults so far.
func minorFaults(t testing.TB) int64 {
	var ru unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_THREAD, &ru))
	return ru.Minflt
}

// untouchedRAM maps size bytes of anonymous RAM in 4 KiB pages (a read
// of an untouched page faults once per page, as in the nested guests
// measured; under a huge zero page it would fault once per 2 MiB) and
// writes a few of them.
func untouchedRAM(t testing.TB, size uint64) *Memory {
	m, err := NewMemory([]MemoryRegion{{GPA: 0, Size: size}})
	require.NoError(t, err)
	require.NoError(t, unix.Madvise(m.regions[0].host, unix.MADV_NOHUGEPAGE))
	for gpa := uint64(0); gpa < size; gpa += 4 << 20 {
		require.NoError(t, m.WriteAt([]byte("touched"), gpa+123))
	}
	return m
}

// faultsWriting returns the minor faults writing a snapshot of m costs.
func faultsWriting(t testing.TB, m *Memory, plain bool) int64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f, err := os.Create(filepath.Join(t.TempDir(), "snap"))
	require.NoError(t, err)
	defer f.Close()
	before := minorFaults(t)
	require.NoError(t, writeMemorySnapshot(f, m, plain))
	return minorFaults(t) - before
}

func TestSparseSnapshotFaultsInOnlyTouchedPages(t *testing.T) {
	if openPagemap() == nil {
		t.Skip("/proc/self/pagemap cannot be read here")
	}
	const size = 256 << 20
	m := untouchedRAM(t, size)
	defer m.Close()
	sparse := faultsWriting(t, m, false)
	old := untouchedRAM(t, size)
	defer old.Close()
	plain := faultsWriting(t, old, true)
	t.Logf("minor faults writing 256 MiB, 64 pages touched: sparse %d, plain %d", sparse, plain)
	require.Less(t, sparse, int64(size/pageSize/8), "faults while writing a mostly untouched 256 MiB")
}

// Without pagemap every page is read and nothing skipped.
func TestSparseWithoutPagemapReadsEverything(t *testing.T) {
	m, err := NewMemory([]MemoryRegion{{GPA: 0, Size: 4 << 20}})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.WriteAt([]byte("data"), 3<<20))
	var out bytes.Buffer
	n, err := writeRegionSparse(&out, func(int64) error { return io.ErrUnexpectedEOF }, nil, nil, m.regions[0])
	require.NoError(t, err, "no skip")
	require.EqualValues(t, 4<<20, n)
	require.True(t, bytes.Equal(m.regions[0].host, out.Bytes()))
}

// A snapshot written through the sparse path maps back as the same RAM,
// and Reader reads what WriteTo writes.
func TestSparseSnapshotMapsBackTheSameRAM(t *testing.T) {
	regions := []MemoryRegion{{GPA: 0, Size: 8 << 20}, {GPA: 1 << 32, Size: 2 << 20}}
	m, err := NewMemory(regions)
	require.NoError(t, err)
	defer m.Close()
	for _, gpa := range []uint64{0, 5<<20 + 3, 8<<20 - 4, 1 << 32, 1<<32 + 2<<20 - 9} {
		require.NoError(t, m.WriteAt([]byte("ram!"), gpa))
	}
	var want bytes.Buffer
	_, err = m.WriteTo(&want)
	require.NoError(t, err)
	got, err := io.ReadAll(struct{ io.Reader }{m.Reader()})
	require.NoError(t, err)
	require.True(t, bytes.Equal(want.Bytes(), got), "Reader reads what WriteTo writes")

	sf, err := snapshot.Open(snapshotFile(t, m, false), sparseID)
	require.NoError(t, err)
	defer sf.Close()
	_, offset, ok := sf.Section(SectionMemory)
	require.True(t, ok)
	back, err := NewMemoryFromImage(regions, MemoryImage{FD: int(sf.Fd()), Offset: offset})
	require.NoError(t, err)
	defer back.Close()
	var again bytes.Buffer
	_, err = back.WriteTo(&again)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want.Bytes(), again.Bytes()), "the snapshot maps back as the same RAM")
}

// RAM mapped from an image that can no longer be read (here truncated
// under it: a read through the mapping is a SIGBUS, as on a full tmpfs)
// fails the write with an error instead of ending the process.
func TestUnreadableImageRAMFailsTheWrite(t *testing.T) {
	const size = 1 << 20
	f := imageFile(t, 0, size, map[int64][]byte{0: []byte("data"), size - 4: []byte("last")})
	m, err := NewMemoryFromImage([]MemoryRegion{{GPA: 0, Size: size}}, MemoryImage{FD: int(f.Fd()), Offset: 0})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, f.Truncate(pageSize))
	f.Close()
	_, err = m.WriteTo(new(bytes.Buffer)) // copies: reads every page
	require.ErrorContains(t, err, "cannot be read")
}
