package blk

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// Every malformed request gets an error status (or, with nowhere to put
// one, used length 0), and the device goes on serving.
func TestHostileRequests(t *testing.T) {
	const capacity = testImageSize / SectorSize
	many := func(n int, size uint32, writable bool) []*buffer {
		var bufs []*buffer
		for range n {
			if writable {
				bufs = append(bufs, wr(size))
			} else {
				bufs = append(bufs, rd(make([]byte, size)))
			}
		}
		return bufs
	}
	cat := func(parts ...[]*buffer) []*buffer {
		var all []*buffer
		for _, p := range parts {
			all = append(all, p...)
		}
		return all
	}
	one := func(b ...*buffer) []*buffer { return b }
	for _, tc := range []struct {
		name     string
		bufs     []*buffer
		indirect bool
		status   int // -1: no status byte, used length 0
	}{
		{"header too short", one(rd(make([]byte, 8)), wr(1)), false, int(statusIOErr)},
		{"no readable buffer", one(wr(513)), false, int(statusIOErr)},
		{"no status byte", one(rd(header(typeIn, 0))), false, -1},
		{"write without status byte", one(rd(header(typeOut, 0), make([]byte, 512))), false, -1},
		{"read at the capacity", one(rd(header(typeIn, capacity)), wr(512), wr(1)), false, int(statusIOErr)},
		{"read across the end", one(rd(header(typeIn, capacity-1)), wr(1024), wr(1)), false, int(statusIOErr)},
		{"write across the end", one(rd(header(typeOut, capacity-1), make([]byte, 1024)), wr(1)), false, int(statusIOErr)},
		{"sector 1<<63", one(rd(header(typeIn, 1<<63)), wr(512), wr(1)), false, int(statusIOErr)},
		{"sector*512 wraps to 0", one(rd(header(typeOut, 1<<55), make([]byte, 512)), wr(1)), false, int(statusIOErr)},
		{"sector max", one(rd(header(typeIn, ^uint64(0))), wr(512), wr(1)), false, int(statusIOErr)},
		{"unaligned read", one(rd(header(typeIn, 0)), wr(100), wr(1)), false, int(statusIOErr)},
		{"unaligned write", one(rd(header(typeOut, 0), make([]byte, 513)), wr(1)), false, int(statusIOErr)},
		{"writable data on a write", one(rd(header(typeOut, 0)), wr(512), wr(1)), false, int(statusIOErr)},
		{"readable data on a read", one(rd(header(typeIn, 0), make([]byte, 512)), wr(512), wr(1)), false, int(statusIOErr)},
		{"readable data on a get-id", one(rd(header(typeGetID, 0), make([]byte, 4)), wr(IDBytes), wr(1)), false, int(statusIOErr)},
		{"short get-id buffer", one(rd(header(typeGetID, 0)), wr(IDBytes-1), wr(1)), false, int(statusIOErr)},
		{"unknown type", one(rd(header(99, 0)), wr(1)), false, int(statusUnsupp)},
		{"legacy barrier bit", one(rd(header(1<<31|typeIn, 0)), wr(512), wr(1)), false, int(statusUnsupp)},
		{"too many segments", cat(one(rd(header(typeIn, 0))), many(SegMax+1, 512, true), one(wr(1))), true, int(statusIOErr)},
		{"too many write segments", cat(one(rd(header(typeOut, 0))), many(SegMax+1, 512, false), one(wr(1))), true, int(statusIOErr)},
		{"segment over size_max", one(rd(header(typeIn, 0)), wr(2*SizeMax), wr(1)), false, int(statusIOErr)},
		{"huge indirect chain", cat(one(rd(header(typeOut, 0))), many(4096, 512, false), one(wr(1))), true, int(statusIOErr)},
		{"discard of two segments", one(rd(header(typeDiscard, 0), segment(0, 8, 0), segment(16, 8, 0)), wr(1)), false, int(statusIOErr)},
		{"discard without segment", one(rd(header(typeDiscard, 0)), wr(1)), false, int(statusIOErr)},
		{"discard of a partial segment", one(rd(header(typeDiscard, 0), make([]byte, 15)), wr(1)), false, int(statusIOErr)},
		{"discard with unmap", one(rd(header(typeDiscard, 0), segment(0, 8, flagUnmap)), wr(1)), false, int(statusUnsupp)},
		{"discard with unknown flags", one(rd(header(typeDiscard, 0), segment(0, 8, 4)), wr(1)), false, int(statusUnsupp)},
		{"write-zeroes with unknown flags", one(rd(header(typeWriteZeroes, 0), segment(0, 8, 3)), wr(1)), false, int(statusUnsupp)},
		{"discard past the end", one(rd(header(typeDiscard, 0), segment(capacity-1, 2, 0)), wr(1)), false, int(statusIOErr)},
		{"discard at sector max", one(rd(header(typeDiscard, 0), segment(^uint64(0), 1, 0)), wr(1)), false, int(statusIOErr)},
		{"discard too long", one(rd(header(typeDiscard, 0), segment(0, MaxDiscardSectors+1, 0)), wr(1)), false, int(statusIOErr)},
		{"write-zeroes with writable data", one(rd(header(typeWriteZeroes, 0), segment(0, 8, 0)), wr(16), wr(1)), false, int(statusIOErr)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newImage(t, testImageSize)
			g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{MemSize: 32 << 20})
			r := g.submit(tc.indirect, tc.bufs...)
			if tc.status < 0 {
				require.Zero(t, r.used)
			} else {
				require.Equal(t, tc.status, r.status)
				require.EqualValues(t, 1, r.used, "a refused request writes only its status")
			}
			g.requireServing()
			require.Equal(t, make([]byte, 2*SectorSize), readFile(t, f, int64(capacity-2)*SectorSize, 2*SectorSize),
				"a refused request wrote at the end of the disk")
		})
	}
}

func readFile(t *testing.T, f interface {
	ReadAt([]byte, int64) (int, error)
}, off int64, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := f.ReadAt(b, off)
	require.NoError(t, err)
	return b
}

// A write that wraps sector*512 must not land at sector 0.
func TestWrappedSectorWritesNothing(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{})
	status, _ := g.write(1<<55, pattern(SectorSize, 1), SectorSize)
	require.Equal(t, int(statusIOErr), status)
	require.Equal(t, make([]byte, SectorSize), readFile(t, f, 0, SectorSize))
}

// Chains the queue itself refuses come back with used length 0, and the
// device keeps serving (the rng pattern).
func TestChainsTheQueueRefuses(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{MemSize: 1 << 20})
	for _, descs := range [][]virtiotest.Descriptor{
		{{Addr: 1 << 40, Len: 16, Flags: virtio.DescFlagNext, Next: 1}, {Addr: 0x1000, Len: 1, Flags: virtio.DescFlagWrite}},
		{{Addr: 0x1000, Len: 16, Flags: virtio.DescFlagWrite | virtio.DescFlagNext, Next: 1}, {Addr: 0x2000, Len: 16}},
		{{Addr: 0x1000, Len: 16, Flags: virtio.DescFlagNext, Next: 0}}, // a loop
	} {
		require.NoError(t, g.q.WriteTable(g.q.Layout().DescTable, descs))
		require.NoError(t, g.q.PublishHead(0))
		g.q.Kick()
		used, err := g.q.Wait(5 * time.Second)
		require.NoError(t, err)
		require.Zero(t, used.Len)
		g.requireServing()
	}
}

func TestBrokenQueueNeedsReset(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{QueueSizes: []uint16{4}})
	require.NoError(t, g.q.SetAvailIdx(100))
	g.q.Kick()
	deadline := time.Now().Add(5 * time.Second)
	for g.drv.Status()&virtio.StatusDeviceNeedsReset == 0 {
		require.True(t, time.Now().Before(deadline), "device never set DEVICE_NEEDS_RESET")
		time.Sleep(time.Millisecond)
	}
	g.reinit()
}

// A driver that did not negotiate discard or write-zeroes is told they
// are unsupported.
func TestDiscardNotNegotiated(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{RefuseFeatures: FeatureDiscard | FeatureWriteZeroes})
	require.Equal(t, int(statusUnsupp), g.simple(typeDiscard, 0, segment(0, 8, 0)))
	require.Equal(t, int(statusUnsupp), g.simple(typeWriteZeroes, 0, segment(0, 8, 0)))
	g.requireServing()
}

// Requests keep working when the guest's available ring wraps.
func TestManyRequestsWrapTheRing(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{QueueSizes: []uint16{8}})
	for i := range 40 {
		data := pattern(SectorSize, byte(i))
		status, _ := g.write(uint64(i), data, SectorSize)
		require.Equal(t, int(statusOK), status)
		status, got, _ := g.read(uint64(i), SectorSize)
		require.Equal(t, int(statusOK), status)
		require.Equal(t, data, got)
	}
}
