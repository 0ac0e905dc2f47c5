package blk

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

const testImageSize = 8 << 20

func TestReadBackWhatWasWritten(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{})
	data := pattern(64<<10, 1)

	status, used := g.write(8, data, 4096)
	require.Equal(t, int(statusOK), status)
	require.EqualValues(t, 1, used, "a write writes only the status byte")

	// Read back in differently sized buffers, and check the file.
	status, got, used := g.read(8, 512, 31<<10+512, 32<<10)
	require.Equal(t, int(statusOK), status)
	require.Equal(t, data, got)
	require.EqualValues(t, len(data)+1, used)
	onDisk := make([]byte, len(data))
	_, err := f.ReadAt(onDisk, 8*SectorSize)
	require.NoError(t, err)
	require.Equal(t, data, onDisk)

	// The untouched sectors before read as zeros.
	status, got, _ = g.read(0, 8*SectorSize)
	require.Equal(t, int(statusOK), status)
	require.Equal(t, make([]byte, 8*SectorSize), got)
}

func TestLastSectorAndWholeDisk(t *testing.T) {
	f := newImage(t, 1<<20)
	dev := newDevice(t, f, Options{})
	g := startGuest(t, dev, virtiotest.Options{})
	last := dev.Capacity() - 1
	data := pattern(SectorSize, 9)
	status, _ := g.write(last, data, SectorSize)
	require.Equal(t, int(statusOK), status)
	sizes := make([]uint32, 8)
	for i := range sizes {
		sizes[i] = SizeMax
	}
	status, got, _ := g.read(0, sizes...)
	require.Equal(t, int(statusOK), status)
	require.Equal(t, data, got[len(got)-SectorSize:])
}

// Framing is the driver's choice (virtio 1.2 §2.6.4): the header may share
// a buffer with the data, or be split, and the status may end the data's
// last buffer.
func TestAnyFraming(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{})
	data := pattern(2*SectorSize, 3)

	hdr := header(typeOut, 4)
	r := g.submit(false, rd(hdr[:5]), rd(hdr[5:], data[:100]), rd(data[100:]), wr(1))
	require.Equal(t, int(statusOK), r.status)

	in := wr(2*SectorSize + 1) // data and status in one buffer
	r = g.submit(true, rd(header(typeIn, 4)), in)
	require.Equal(t, int(statusOK), r.status)
	require.Equal(t, data, in.got[:2*SectorSize])
	require.EqualValues(t, 2*SectorSize+1, r.used)
}

func TestIndirectChains(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{})
	data := pattern(SegMax*SectorSize, 5)
	bufs := []*buffer{rd(header(typeOut, 0))}
	for i := range SegMax {
		bufs = append(bufs, rd(data[i*SectorSize:(i+1)*SectorSize]))
	}
	r := g.submit(true, append(bufs, wr(1))...)
	require.Equal(t, int(statusOK), r.status, "SegMax segments are allowed")
	status, got, _ := g.read(0, uint32(len(data)))
	require.Equal(t, int(statusOK), status)
	require.Equal(t, data, got)
}

func TestFlush(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{})
	status, _ := g.write(0, pattern(4096, 2), 4096)
	require.Equal(t, int(statusOK), status)
	require.Equal(t, int(statusOK), g.simple(typeFlush, 0, nil))
	// A flush carrying data (which a driver should not send) is harmless.
	require.Equal(t, int(statusOK), g.simple(typeFlush, 0, make([]byte, 512)))
}

// A driver that refuses FLUSH gets write-through; writes still work.
func TestWithoutFlushFeature(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{RefuseFeatures: FeatureFlush})
	require.Zero(t, g.drv.Features()&FeatureFlush)
	g.requireServing()
}

func TestGetID(t *testing.T) {
	for _, tc := range []struct{ serial, want string }{
		{"", DefaultSerial},
		{"data-disk", "data-disk"},
		{"exactly-twenty-bytes", "exactly-twenty-bytes"},
	} {
		f := newImage(t, testImageSize)
		g := startGuest(t, newDevice(t, f, Options{Serial: tc.serial}), virtiotest.Options{})
		id := wr(IDBytes)
		r := g.submit(false, rd(header(typeGetID, 0)), id, wr(1))
		require.Equal(t, int(statusOK), r.status)
		require.EqualValues(t, IDBytes+1, r.used)
		want := make([]byte, IDBytes)
		copy(want, tc.want)
		require.Equal(t, want, id.got, "serial %q", tc.serial)
	}
}

// allocatedBytes is how much of f the host filesystem has allocated.
func allocatedBytes(t *testing.T, f *os.File) int64 {
	t.Helper()
	require.NoError(t, f.Sync())
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(int(f.Fd()), &st))
	return st.Blocks * 512
}

// requireHole checks that [off, off+size) of f holds no data.
func requireHole(t *testing.T, f *os.File, off, size int64) {
	t.Helper()
	next, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return // no data after off at all
	}
	require.NoError(t, err)
	require.GreaterOrEqual(t, next, off+size, "data at %d inside the hole [%d, +%d)", next, off, size)
}

func TestDiscardPunchesAHole(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{})
	for i := range 8 {
		status, _ := g.write(uint64(i*256), pattern(128<<10, byte(i)), 4096)
		require.Equal(t, int(statusOK), status)
	}
	before := allocatedBytes(t, f)
	require.GreaterOrEqual(t, before, int64(1<<20))

	// Discard the second 512 KiB.
	status := g.simple(typeDiscard, 0, segment(1024, 1024, 0))
	require.Equal(t, int(statusOK), status)
	after := allocatedBytes(t, f)
	require.LessOrEqual(t, after, before-512<<10, "discard freed nothing (%d → %d bytes)", before, after)
	requireHole(t, f, 1024*SectorSize, 1024*SectorSize)

	status, got, _ := g.read(1024, 64<<10)
	require.Equal(t, int(statusOK), status)
	require.Equal(t, make([]byte, 64<<10), got)
	status, got, _ = g.read(0, 128<<10)
	require.Equal(t, int(statusOK), status)
	require.Equal(t, pattern(128<<10, 0), got, "data before the discard is kept")
	require.Equal(t, int64(testImageSize), fileSize(t, f), "discard keeps the size")
}

func fileSize(t *testing.T, f *os.File) int64 {
	t.Helper()
	info, err := f.Stat()
	require.NoError(t, err)
	return info.Size()
}

func TestWriteZeroes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags uint32
		hole  bool
	}{{"unmap", flagUnmap, true}, {"keep allocated", 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newImage(t, testImageSize)
			g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{})
			status, _ := g.write(0, pattern(256<<10, 4), 4096)
			require.Equal(t, int(statusOK), status)
			require.Equal(t, int(statusOK), g.simple(typeWriteZeroes, 0, segment(128, 256, tc.flags)))
			status, got, _ := g.read(0, 128<<10, 128<<10)
			require.Equal(t, int(statusOK), status)
			want := pattern(256<<10, 4)
			copy(want[128*SectorSize:384*SectorSize], make([]byte, 256*SectorSize))
			require.Equal(t, want, got)
			if tc.hole {
				requireHole(t, f, 128*SectorSize, 256*SectorSize)
			}
		})
	}
}

// On a host filesystem with neither holes nor zero ranges, write-zeroes
// writes zeros and discard does nothing, both successfully.
func TestZeroesWithoutFallocate(t *testing.T) {
	f := newImage(t, testImageSize)
	dev := newDevice(t, f, Options{})
	dev.backing.(*File).fallocate = func(int, uint32, int64, int64) error { return unix.EOPNOTSUPP }
	g := startGuest(t, dev, virtiotest.Options{})
	data := pattern(1<<20, 6)
	status, _ := g.write(0, data, SizeMax)
	require.Equal(t, int(statusOK), status)

	require.Equal(t, int(statusOK), g.simple(typeDiscard, 0, segment(0, 8, 0)))
	require.Equal(t, int(statusOK), g.simple(typeWriteZeroes, 0, segment(1, 1500, flagUnmap)))
	onDisk := make([]byte, len(data))
	_, err := f.ReadAt(onDisk, 0)
	require.NoError(t, err)
	want := bytes.Clone(data)
	copy(want[SectorSize:1501*SectorSize], make([]byte, 1500*SectorSize))
	require.Equal(t, want, onDisk)
}

func TestHostErrorIsIOErr(t *testing.T) {
	f := newImage(t, testImageSize)
	dev := newDevice(t, f, Options{})
	dev.backing.(*File).fallocate = func(int, uint32, int64, int64) error { return unix.EIO }
	g := startGuest(t, dev, virtiotest.Options{})
	require.Equal(t, int(statusIOErr), g.simple(typeDiscard, 0, segment(0, 8, 0)))
	g.requireServing()
}

func sha(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return sha256.Sum256(b)
}

func TestReadOnly(t *testing.T) {
	rw := newImage(t, testImageSize)
	_, err := rw.WriteAt(pattern(1<<20, 8), 0)
	require.NoError(t, err)
	f, err := os.Open(rw.Name())
	require.NoError(t, err)
	defer f.Close()
	before := sha(t, f.Name())

	dev := newDevice(t, f, Options{ReadOnly: true})
	g := startGuest(t, dev, virtiotest.Options{})
	require.NotZero(t, g.drv.Features()&FeatureRO)
	require.Zero(t, g.drv.Features()&(FeatureDiscard|FeatureWriteZeroes))

	status, _ := g.write(0, make([]byte, 4096), 4096)
	require.Equal(t, int(statusIOErr), status)
	require.Equal(t, int(statusIOErr), g.simple(typeDiscard, 0, segment(0, 8, 0)))
	require.Equal(t, int(statusIOErr), g.simple(typeWriteZeroes, 0, segment(0, 8, flagUnmap)))
	require.Equal(t, int(statusIOErr), g.simple(typeWriteZeroes, 0, segment(0, 8, 0)))
	require.Equal(t, int(statusOK), g.simple(typeFlush, 0, nil))

	status, got, _ := g.read(0, 64<<10)
	require.Equal(t, int(statusOK), status)
	require.Equal(t, pattern(1<<20, 8)[:64<<10], got)
	require.Equal(t, before, sha(t, f.Name()), "a read-only disk changed")
}

func TestNewRefuses(t *testing.T) {
	dir := t.TempDir()
	create := func(name string, size int64) *os.File {
		f, err := os.Create(filepath.Join(dir, name))
		require.NoError(t, err)
		t.Cleanup(func() { _ = f.Close() })
		require.NoError(t, f.Truncate(size))
		return f
	}
	_, err := New(create("empty", 0), Options{})
	require.ErrorContains(t, err, "is empty")
	_, err = New(create("odd", 4097), Options{})
	require.ErrorContains(t, err, "not a multiple of the 512-byte sector")
	_, err = New(nil, Options{})
	require.Error(t, err)

	d, err := os.Open(dir)
	require.NoError(t, err)
	defer d.Close()
	_, err = New(d, Options{ReadOnly: true})
	require.ErrorContains(t, err, "not a regular file")

	ro, err := os.Open(create("ro", 4096).Name())
	require.NoError(t, err)
	defer ro.Close()
	_, err = New(ro, Options{})
	require.ErrorContains(t, err, "open read-only")
	_, err = New(ro, Options{ReadOnly: true})
	require.NoError(t, err)

	good := create("good", 4096)
	_, err = New(good, Options{Serial: strings.Repeat("x", IDBytes+1)})
	require.ErrorContains(t, err, "longer than")
	_, err = New(good, Options{Serial: "tab\there"})
	require.ErrorContains(t, err, "printable")
}

// unsliceable hides SliceMemory's Slice.
type unsliceable struct{ virtio.GuestMemory }

func TestActivateNeedsMappableMemory(t *testing.T) {
	dev := newDevice(t, newImage(t, 4096), Options{})
	mem := virtio.NewSliceMemory(1 << 20)
	q, err := virtio.NewQueue(mem, virtio.QueueLayout{Size: 4, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 0x3000}, 0)
	require.NoError(t, err)
	err = dev.Activate(unsliceable{mem}, nil, []*virtio.Queue{q}, 0)
	require.ErrorContains(t, err, "Slicer")
	require.Error(t, dev.Activate(mem, nil, []*virtio.Queue{nil}, 0))
	dev.Reset() // never activated: a no-op
}

func TestResetAndReinit(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{})
	g.requireServing()
	g.reinit()
}

func TestRefusalsAreLoggedRateLimited(t *testing.T) {
	logs := &ratelogtest.LogBuffer{}
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{Logger: logs.Logger()}), virtiotest.Options{})
	for range 3 * ratelog.DefaultBurst {
		require.Equal(t, int(statusUnsupp), g.simple(99, 0, nil))
	}
	lines := logs.Lines("virtio-blk: refused a request")
	require.Len(t, lines, ratelog.DefaultBurst, logs.String())
	require.Contains(t, lines[0], "device=virtio-blk")
	require.Contains(t, lines[0], "unknown request type")
}
