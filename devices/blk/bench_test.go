package blk

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// The benchmarks move 1 MiB per request through the test driver, in
// SizeMax segments (as a guest's merged pages would be), beside a bare
// pread or pwrite of the same size on the same file: the ratio is the
// device's overhead (queue, mapping, interrupt, the driver's polling).

const benchBytes = 1 << 20

// benchChain lays out one request of typ at sector 0 whose data is
// benchBytes in SizeMax buffers (writable for a read), once; each
// iteration then republishes the same head.
func benchChain(b *testing.B, g *guest, typ uint32) []*buffer {
	bufs := []*buffer{rd(header(typ, 0))}
	for range benchBytes / SizeMax {
		if typ == typeIn {
			bufs = append(bufs, wr(SizeMax))
		} else {
			bufs = append(bufs, rd(pattern(SizeMax, 1)))
		}
	}
	bufs = append(bufs, wr(1))
	descs := make([]virtiotest.Descriptor, len(bufs))
	for i, buf := range bufs {
		addr, err := g.drv.Alloc(uint64(buf.len()), 4096)
		require.NoError(b, err)
		if !buf.writable {
			require.NoError(b, g.drv.Mem.WriteAt(buf.data, addr))
		}
		buf.addr = addr
		descs[i] = virtiotest.Descriptor{Addr: addr, Len: buf.len()}
		if buf.writable {
			descs[i].Flags = virtio.DescFlagWrite
		}
		if i+1 < len(bufs) {
			descs[i].Flags |= virtio.DescFlagNext
			descs[i].Next = uint16(i + 1)
		}
	}
	require.NoError(b, g.q.WriteTable(g.q.Layout().DescTable, descs))
	return bufs
}

func benchDevice(b *testing.B, typ uint32) {
	f := newImage(b, 64<<20)
	_, err := f.WriteAt(pattern(benchBytes, 2), 0) // in the page cache, not a hole
	require.NoError(b, err)
	g := startGuest(b, newDevice(b, f, Options{}), virtiotest.Options{MemSize: 8 << 20})
	// One request first, whose status proves the layout.
	require.Equal(b, int(statusOK), g.publish(benchChain(b, g, typ)).status)
	b.SetBytes(benchBytes)
	b.ResetTimer()
	for range b.N {
		if err := g.q.PublishHead(0); err != nil {
			b.Fatal(err)
		}
		g.q.Kick()
		used, err := g.q.Wait(10 * time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if typ == typeIn && used.Len != benchBytes+1 || typ == typeOut && used.Len != 1 {
			b.Fatalf("used length %d", used.Len)
		}
	}
}

func benchBare(b *testing.B, write bool) {
	f := newImage(b, 64<<20)
	buf := pattern(benchBytes, 2)
	_, err := f.WriteAt(buf, 0)
	require.NoError(b, err)
	fd := int(f.Fd())
	b.SetBytes(benchBytes)
	b.ResetTimer()
	for range b.N {
		var n int
		if write {
			n, err = unix.Pwrite(fd, buf, 0)
		} else {
			n, err = unix.Pread(fd, buf, 0)
		}
		if err != nil || n != benchBytes {
			b.Fatal(n, err)
		}
	}
}

func BenchmarkRead1MiB(b *testing.B)   { benchDevice(b, typeIn) }
func BenchmarkWrite1MiB(b *testing.B)  { benchDevice(b, typeOut) }
func BenchmarkPread1MiB(b *testing.B)  { benchBare(b, false) }
func BenchmarkPwrite1MiB(b *testing.B) { benchBare(b, true) }
