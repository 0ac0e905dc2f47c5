package blk

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// fuzzSizes are the buffer sizes a layout byte picks from: around the
// header, segment, id and sector sizes, and past size_max.
var fuzzSizes = [16]uint32{0, 1, 4, 8, 15, 16, 17, 20, 21, 511, 512, 513, 1024, 4096, SizeMax, SizeMax + 512}

const fuzzImageSize = 1 << 20

// FuzzRequest sends one request of arbitrary type, sector, bytes and
// buffer layout, then checks that the answer is sane and that the device
// still serves a good read and write.
func FuzzRequest(f *testing.F) {
	good := []byte{0x00, 0x0a, 0x8a, 0x81} // header, 512 readable or writable, status
	f.Add(uint32(typeIn), uint64(0), byte(0), []byte{0x0d, 0x8a, 0x81}, []byte{})
	f.Add(uint32(typeOut), uint64(3), byte(0), good, []byte("data"))
	f.Add(uint32(typeDiscard), uint64(0), byte(0), []byte{0x05, 0x05, 0x81}, segment(0, 8, 0))
	f.Add(uint32(typeWriteZeroes), uint64(0), byte(1), []byte{0x05, 0x05, 0x81}, segment(7, 100, flagUnmap))
	f.Add(uint32(typeGetID), uint64(0), byte(2), []byte{0x05, 0x87, 0x81}, []byte{})
	f.Add(uint32(typeFlush), uint64(0), byte(0), []byte{}, []byte{})
	f.Add(uint32(99), uint64(1<<63), byte(4), []byte{0x03, 0x81}, []byte{1, 2, 3})
	img := newImage(f, fuzzImageSize)
	f.Fuzz(func(t *testing.T, typ uint32, sector uint64, mode byte, layout, payload []byte) {
		dev, err := New(img, Options{ReadOnly: mode&8 != 0})
		require.NoError(t, err)
		g := startGuest(t, dev, virtiotest.Options{MemSize: 4 << 20})
		if mode&1 != 0 { // mostly in range, to reach the host I/O
			sector %= dev.Capacity() + 2
		}
		stream := payload
		if mode&4 == 0 {
			stream = append(header(typ, sector), payload...)
		}
		bufs, writable := fuzzLayout(layout, stream)
		r := g.submit(mode&2 != 0, bufs...)
		require.LessOrEqual(t, r.used, writable)
		if writable == 0 {
			require.Zero(t, r.used)
		} else if r.used > 0 {
			require.Contains(t, []int{int(statusOK), int(statusIOErr), int(statusUnsupp)}, r.status)
		}
		if !dev.readOnly {
			g.requireServing()
		}
	})
}

// fuzzLayout turns layout bytes into at most 16 buffers: bit 7 makes one
// writable, the low four bits pick its size; readable ones are filled from
// stream in order. An empty layout is stream and a status byte.
func fuzzLayout(layout, stream []byte) ([]*buffer, uint32) {
	if len(layout) == 0 {
		return []*buffer{rd(stream), wr(1)}, 1
	}
	var bufs []*buffer
	var writable uint32
	for _, l := range layout[:min(len(layout), 16)] {
		size := fuzzSizes[l&0x0f]
		if l&0x80 != 0 {
			bufs = append(bufs, wr(size))
			writable += size
			continue
		}
		data := make([]byte, size)
		stream = stream[copy(data, stream):]
		bufs = append(bufs, rd(data))
	}
	return bufs, writable
}
