package cow

import (
	"encoding/binary"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// Request types and status (virtio 1.2 §5.2.6), as a driver writes them.
const (
	reqIn          = 0
	reqOut         = 1
	reqFlush       = 4
	reqDiscard     = 11
	reqWriteZeroes = 13
	statusOK       = 0
	statusIOErr    = 1
)

// driver sends virtio-blk requests to a device, one at a time.
type driver struct {
	t *testing.T
	q *virtiotest.DriverQueue
}

func header(typ uint32, sector uint64) []byte {
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h[0:], typ)
	binary.LittleEndian.PutUint64(h[8:], sector)
	return h
}

// send adds one chain, kicks, and returns what the device wrote back.
func (d *driver) send(bufs ...virtiotest.Buffer) []byte {
	d.t.Helper()
	_, err := d.q.AddIndirect(bufs...)
	require.NoError(d.t, err)
	d.q.Kick()
	used, err := d.q.Wait(10 * time.Second)
	require.NoError(d.t, err)
	return used.Data
}

// read reads n bytes at sector in 4 KiB buffers and returns the status.
func (d *driver) read(sector uint64, n int) (byte, []byte) {
	bufs := []virtiotest.Buffer{virtiotest.Readable(header(reqIn, sector))}
	for at := 0; at < n; at += 4096 {
		bufs = append(bufs, virtiotest.Writable(uint32(min(4096, n-at))))
	}
	got := d.send(append(bufs, virtiotest.Writable(1))...)
	require.Len(d.t, got, n+1)
	return got[n], got[:n]
}

// write writes data at sector in 4 KiB buffers and returns the status.
func (d *driver) write(sector uint64, data []byte) byte {
	bufs := []virtiotest.Buffer{virtiotest.Readable(header(reqOut, sector))}
	for _, b := range split(data, 4096) {
		bufs = append(bufs, virtiotest.Readable(b))
	}
	return d.send(append(bufs, virtiotest.Writable(1))...)[0]
}

// simple sends a request of typ at sector carrying extra.
func (d *driver) simple(typ uint32, sector uint64, extra []byte) byte {
	return d.send(virtiotest.Readable(append(header(typ, sector), extra...)), virtiotest.Writable(1))[0]
}

func segment(sector uint64, count, flags uint32) []byte {
	s := make([]byte, 16)
	binary.LittleEndian.PutUint64(s[0:], sector)
	binary.LittleEndian.PutUint32(s[8:], count)
	binary.LittleEndian.PutUint32(s[12:], flags)
	return s
}

// The blk device serves a Disk through its queue as it serves a file:
// reads of the base, partial writes merged, flush, discard and
// write-zeroes, bounds refused; the base untouched and the writes there
// after a reset and a reopening.
func TestDeviceServesTheOverlay(t *testing.T) {
	fx := newFixture(t)
	before := fx.imageSum()
	disk := fx.open()
	dev, err := blk.NewBacked(disk, blk.Options{Serial: "bundle-root", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.EqualValues(t, testBaseLength/blk.SectorSize, dev.Capacity())
	drv := virtiotest.Start(t, dev, virtiotest.Options{MemSize: 32 << 20})
	g := &driver{t: t, q: drv.Queue(0)}
	want := fx.baseBytes()

	status, got := g.read(0, 4*ClusterSize)
	require.EqualValues(t, statusOK, status)
	require.Equal(t, want[:4*ClusterSize], got, "untouched clusters read the base")

	data := pattern(3*ClusterSize, 8)
	require.EqualValues(t, statusOK, g.write(ClusterSize/blk.SectorSize+3, data))
	copy(want[ClusterSize+3*blk.SectorSize:], data)
	require.EqualValues(t, statusOK, g.simple(reqFlush, 0, nil))
	require.EqualValues(t, statusOK, g.simple(reqDiscard, 0, segment(6*ClusterSize/blk.SectorSize, ClusterSize/blk.SectorSize, 0)))
	clear(want[6*ClusterSize : 7*ClusterSize])
	require.EqualValues(t, statusOK, g.simple(reqWriteZeroes, 0, segment(8*ClusterSize/blk.SectorSize+1, 2, 1)))
	clear(want[8*ClusterSize+blk.SectorSize : 8*ClusterSize+3*blk.SectorSize])

	capacity := uint64(testBaseLength / blk.SectorSize)
	require.EqualValues(t, statusIOErr, g.write(capacity-1, make([]byte, 1024)), "a write across the end")
	require.EqualValues(t, statusIOErr, g.simple(reqWriteZeroes, 0, segment(capacity, 1, 0)), "write-zeroes past the end")

	status, got = g.read(0, 10*ClusterSize)
	require.EqualValues(t, statusOK, status)
	require.Equal(t, want[:10*ClusterSize], got)

	drv.Reset()
	require.NoError(t, disk.Close())
	require.Equal(t, before, fx.imageSum(), "the base image changed")
	requireContent(t, fx.open(), want, "after reset and reopening")
}
