package blk

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// newImage returns a sparse image of size bytes in a temporary directory,
// open for reading and writing.
func newImage(tb testing.TB, size int64) *os.File {
	tb.Helper()
	f, err := os.OpenFile(filepath.Join(tb.TempDir(), "disk.img"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = f.Close() })
	require.NoError(tb, f.Truncate(size))
	return f
}

// newDevice is New that fails tb on error.
func newDevice(tb testing.TB, f *os.File, opts Options) *Device {
	tb.Helper()
	dev, err := New(f, opts)
	require.NoError(tb, err)
	return dev
}

// guest plays the driver of one blk device, one request at a time, with
// chains it lays out itself: the test driver's Add reports only the first
// used-length bytes, and an error's status byte lies past them.
type guest struct {
	tb  testing.TB
	drv *virtiotest.Driver
	q   *virtiotest.DriverQueue
	dev *Device
}

func startGuest(tb testing.TB, dev *Device, opts virtiotest.Options) *guest {
	tb.Helper()
	drv := virtiotest.Start(tb, dev, opts)
	return &guest{tb: tb, drv: drv, q: drv.Queue(0), dev: dev}
}

// reinit resets the device as a driver does, brings it up on wiped
// memory, and checks it serves again.
func (g *guest) reinit() {
	g.tb.Helper()
	g.drv.Reset()
	require.NoError(g.tb, g.drv.Mem.WriteAt(make([]byte, g.drv.Mem.Size()), 0))
	require.NoError(g.tb, g.drv.Init())
	g.q = g.drv.Queue(0)
	g.requireServing()
}

// buffer is one buffer of a request chain: readable with data, or
// writable of size bytes (got holds what the device left there).
type buffer struct {
	data     []byte
	size     uint32
	writable bool
	addr     uint64
	got      []byte
}

// rd is a readable buffer holding the concatenation of parts.
func rd(parts ...[]byte) *buffer {
	var data []byte
	for _, p := range parts {
		data = append(data, p...)
	}
	return &buffer{data: data}
}

// wr is a writable buffer of n bytes.
func wr(n uint32) *buffer { return &buffer{size: n, writable: true} }

func (b *buffer) len() uint32 {
	if b.writable {
		return b.size
	}
	return uint32(len(b.data))
}

// poison fills writable buffers before a request, so that bytes the
// device did not write show (and a status byte left alone is not OK).
const poison = 0xee

// reply is what came back for one chain.
type reply struct {
	used   uint32
	status int // the last writable byte; -1 without a writable buffer
}

// header is a request header of typ at sector.
func header(typ uint32, sector uint64) []byte {
	h := make([]byte, headerSize)
	binary.LittleEndian.PutUint32(h[0:], typ)
	binary.LittleEndian.PutUint64(h[8:], sector)
	return h
}

// segment is a discard or write-zeroes segment.
func segment(sector uint64, count, flags uint32) []byte {
	s := make([]byte, segmentSize)
	binary.LittleEndian.PutUint64(s[0:], sector)
	binary.LittleEndian.PutUint32(s[8:], count)
	binary.LittleEndian.PutUint32(s[12:], flags)
	return s
}

// submit lays bufs out as one chain (through an indirect table if asked),
// makes it available, kicks and waits for the answer, then reads the
// writable buffers back.
func (g *guest) submit(indirect bool, bufs ...*buffer) reply {
	g.tb.Helper()
	var allocs [][2]uint64
	defer func() {
		for _, a := range allocs {
			g.drv.Release(a[0], a[1])
		}
	}()
	alloc := func(size, align uint64) uint64 {
		addr, err := g.drv.Alloc(size, align)
		require.NoError(g.tb, err)
		allocs = append(allocs, [2]uint64{addr, size})
		return addr
	}
	descs := make([]virtiotest.Descriptor, len(bufs))
	for i, b := range bufs {
		b.addr = alloc(uint64(max(b.len(), 1)), 8)
		fill := b.data
		if b.writable {
			fill = make([]byte, b.size)
			for j := range fill {
				fill[j] = poison
			}
		}
		require.NoError(g.tb, g.drv.Mem.WriteAt(fill, b.addr))
		descs[i] = virtiotest.Descriptor{Addr: b.addr, Len: b.len()}
		if b.writable {
			descs[i].Flags |= virtio.DescFlagWrite
		}
		if i+1 < len(bufs) {
			descs[i].Flags |= virtio.DescFlagNext
			descs[i].Next = uint16(i + 1)
		}
	}
	if indirect {
		table := alloc(uint64(virtio.DescriptorSize*len(descs)), 16)
		require.NoError(g.tb, g.q.WriteTable(table, descs))
		require.NoError(g.tb, g.q.WriteDescriptor(0, virtiotest.Descriptor{Addr: table, Len: uint32(virtio.DescriptorSize * len(descs)), Flags: virtio.DescFlagIndirect}))
	} else {
		require.NoError(g.tb, g.q.WriteTable(g.q.Layout().DescTable, descs))
	}
	return g.publish(bufs)
}

// publish makes head 0 available, waits for it and reads bufs back.
func (g *guest) publish(bufs []*buffer) reply {
	g.tb.Helper()
	require.NoError(g.tb, g.q.PublishHead(0))
	g.q.Kick()
	used, err := g.q.Wait(10 * time.Second)
	require.NoError(g.tb, err)
	require.Zero(g.tb, used.Head)
	r := reply{used: used.Len, status: -1}
	for _, b := range bufs {
		if !b.writable {
			continue
		}
		b.got = make([]byte, b.size)
		require.NoError(g.tb, g.drv.Mem.ReadAt(b.got, b.addr))
		if b.size > 0 {
			r.status = int(b.got[b.size-1])
		}
	}
	return r
}

// read reads sectors at sector into data buffers of the given sizes and
// returns the status, the data and the used length.
func (g *guest) read(sector uint64, sizes ...uint32) (int, []byte, uint32) {
	g.tb.Helper()
	bufs := []*buffer{rd(header(typeIn, sector))}
	for _, n := range sizes {
		bufs = append(bufs, wr(n))
	}
	status := wr(1)
	r := g.submit(false, append(bufs, status)...)
	var data []byte
	for _, b := range bufs[1:] {
		data = append(data, b.got...)
	}
	return r.status, data, r.used
}

// write writes data at sector, in buffers of at most split bytes.
func (g *guest) write(sector uint64, data []byte, split int) (int, uint32) {
	g.tb.Helper()
	bufs := []*buffer{rd(header(typeOut, sector))}
	for len(data) > 0 {
		n := min(split, len(data))
		bufs = append(bufs, rd(data[:n]))
		data = data[n:]
	}
	r := g.submit(false, append(bufs, wr(1))...)
	return r.status, r.used
}

// simple sends a request of typ at sector with readable extra (none for
// nil) and a lone status byte.
func (g *guest) simple(typ uint32, sector uint64, extra []byte) int {
	g.tb.Helper()
	bufs := []*buffer{rd(header(typ, sector))}
	if extra != nil {
		bufs = append(bufs, rd(extra))
	}
	return g.submit(false, append(bufs, wr(1))...).status
}

// requireServing checks the device still answers a good read and write.
func (g *guest) requireServing() {
	g.tb.Helper()
	data := pattern(SectorSize, 7)
	status, _ := g.write(1, data, SectorSize)
	require.Equal(g.tb, int(statusOK), status, "good write after a bad request")
	status, got, _ := g.read(1, SectorSize)
	require.Equal(g.tb, int(statusOK), status, "good read after a bad request")
	require.Equal(g.tb, data, got)
}

// pattern is n bytes that differ with seed and position.
func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7) ^ seed ^ byte(i>>9)
	}
	return p
}
