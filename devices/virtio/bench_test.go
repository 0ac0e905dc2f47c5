package virtio_test

import (
	"encoding/binary"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// benchQueue lays out a queue whose every descriptor pair i, i+1 is a
// chain of one readable and one writable buffer of payload bytes each.
func benchQueue(b *testing.B, size uint16, payload uint32, features uint64) (*virtio.SliceMemory, *virtio.Queue, virtio.QueueLayout) {
	b.Helper()
	l := virtio.QueueLayout{Size: size, DescTable: 0x10000, AvailRing: 0x20000, UsedRing: 0x30000}
	mem := virtio.NewSliceMemory(0x40000 + 2*int(payload)*int(size))
	for i := uint16(0); i < size; i += 2 {
		bufs := uint64(0x40000) + uint64(i)*uint64(payload)
		var d [32]byte
		binary.LittleEndian.PutUint64(d[0:], bufs)
		binary.LittleEndian.PutUint32(d[8:], payload)
		binary.LittleEndian.PutUint16(d[12:], virtio.DescFlagNext)
		binary.LittleEndian.PutUint16(d[14:], i+1)
		binary.LittleEndian.PutUint64(d[16:], bufs+uint64(payload))
		binary.LittleEndian.PutUint32(d[24:], payload)
		binary.LittleEndian.PutUint16(d[28:], virtio.DescFlagWrite)
		if err := mem.WriteAt(d[:], l.DescTable+16*uint64(i)); err != nil {
			b.Fatal(err)
		}
	}
	q, err := virtio.NewQueue(mem, l, features)
	if err != nil {
		b.Fatal(err)
	}
	return mem, q, l
}

func benchmarkPopPush(b *testing.B, payload uint32, features uint64) {
	const size = 256
	mem, q, l := benchQueue(b, size, payload, features)
	buf := make([]byte, payload)
	b.SetBytes(2 * int64(payload))
	b.ReportAllocs()
	idx := uint16(0)
	for b.Loop() {
		// Driver: publish chain (idx*2) % size.
		_ = mem.PutUint16(l.AvailRing+4+2*uint64(idx%size), (idx*2)%size)
		idx++
		_ = mem.PutUint16(l.AvailRing+2, idx)
		// Device.
		c, err := q.Pop()
		if err != nil || c == nil {
			b.Fatalf("pop: %v", err)
		}
		if _, err := c.Reader().Read(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Writer().Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := q.Push(c, c.Writer().Written()); err != nil {
			b.Fatal(err)
		}
		q.NeedsInterrupt()
	}
}

func BenchmarkQueuePopPush64B(b *testing.B)  { benchmarkPopPush(b, 64, 0) }
func BenchmarkQueuePopPush4KiB(b *testing.B) { benchmarkPopPush(b, 4096, 0) }
func BenchmarkQueuePopPush64BEventIdx(b *testing.B) {
	benchmarkPopPush(b, 64, virtio.FeatureEventIdx)
}
