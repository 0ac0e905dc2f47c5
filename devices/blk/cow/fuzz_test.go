package cow

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
)

// fuzzLayout is the layout of a base picked by size: 32 KiB steps up to
// 2 GiB, so that the bitmap runs from one byte to 8 KiB.
func fuzzLayout(t *testing.T, size uint16) layout {
	l, err := layoutFor((int64(size) + 1) * 64 * blk.SectorSize)
	require.NoError(t, err)
	return l
}

// FuzzDecodeSlot feeds decodeSlot arbitrary slot bytes, with their
// checksums made right when seal is set (so the fuzzer reaches the checks
// behind them). It must never panic, and what it accepts must be exactly
// what encodeSlot writes for the map it returns: a valid generation and
// states, nothing else.
func FuzzDecodeSlot(f *testing.F) {
	for _, size := range []uint16{0, 1, 47, 5000} {
		l := fuzzLayout(&testing.T{}, size)
		states := make([]byte, l.bitmapBytes)
		for i := range states {
			states[i] = []byte{0x00, 0x01, 0x26, 0x99}[i%4]
		}
		if l.clusters%4 != 0 {
			states[len(states)-1] &= 1<<(2*(l.clusters%4)) - 1
		}
		valid := make([]byte, l.slotSize)
		encodeSlot(valid, l, 7, testIdentity, states)
		f.Add(valid, size, testIdentity, false)
		f.Add(valid, size, "another", false)
		f.Add(valid[:headerSize+l.bitmapBytes/2], size, testIdentity, false)
		f.Add(make([]byte, l.slotSize), size, testIdentity, true)
		torn := bytes.Clone(valid)
		torn[headerSize] ^= 0xff
		f.Add(torn, size, testIdentity, false)
		f.Add(torn, size, testIdentity, true) // an invalid state, sealed
	}
	f.Fuzz(func(t *testing.T, buf []byte, size uint16, identity string, seal bool) {
		l := fuzzLayout(t, size)
		if seal && int64(len(buf)) >= headerSize+l.bitmapBytes {
			buf = bytes.Clone(buf)
			le := binary.LittleEndian
			le.PutUint32(buf[hdrBitmapCRC:], crc32.Checksum(buf[headerSize:headerSize+l.bitmapBytes], castagnoli))
			le.PutUint32(buf[hdrHeaderCRC:], headerCRC(buf[:headerSize]))
		}
		s, err := decodeSlot(buf, l, identity)
		if err != nil {
			require.Zero(t, s.gen)
			return
		}
		require.NotZero(t, s.gen)
		require.Len(t, s.states, int(l.bitmapBytes))
		again := make([]byte, l.slotSize)
		encodeSlot(again, l, s.gen, identity, s.states)
		n := headerSize + l.bitmapBytes
		require.Equal(t, buf[:n], again[:n], "accepted a slot encodeSlot would not write")
		for c := range l.clusters {
			require.NotEqual(t, byte(stateInvalid), s.states[c/4]>>(2*(c%4))&3)
		}
	})
}

// FuzzDiskOps runs a sequence of writes, write-zeroes, whole-cluster
// discards, flushes and reopenings, decoded from ops, against a Disk and
// against a plain byte slice, and requires the Disk to read as the slice
// after each reopening and at the end, the base untouched.
func FuzzDiskOps(f *testing.F) {
	f.Add([]byte{0, 10, 3, 1, 9, 2, 3, 0, 0, 4, 0, 0})
	f.Add([]byte{0, 0, 200, 2, 1, 1, 0, 47, 255, 3, 5, 2, 4, 1, 1})
	f.Add([]byte{1, 48, 40, 0, 48, 50, 4, 0, 0, 0, 47, 90})
	f.Fuzz(func(t *testing.T, ops []byte) {
		fx := newSizedFixture(t, 2<<20, 8*ClusterSize+1536)
		before := fx.imageSum()
		d := fx.open()
		want := fx.baseBytes()
		sectors := fx.length / blk.SectorSize
		for len(ops) >= 3 && len(ops) <= 3*64 {
			kind, a, b := ops[0]%5, int64(ops[1]), int64(ops[2])
			ops = ops[3:]
			off := a * sectors / 256 * blk.SectorSize
			n := min((b+1)*blk.SectorSize*3, fx.length-off)
			switch kind {
			case 0:
				data := pattern(int(n), byte(a^b))
				require.NoError(t, d.WriteV(split(data, 777*blk.SectorSize/512+1), off))
				copy(want[off:], data)
			case 1:
				require.NoError(t, d.WriteZeroes(off, n, b%2 == 0))
				clear(want[off : off+n])
			case 2: // whole clusters only: their content is then defined
				c := a % (int64(len(want)) / ClusterSize)
				require.NoError(t, d.Discard(c*ClusterSize, ClusterSize))
				clear(want[c*ClusterSize : (c+1)*ClusterSize])
			case 3:
				require.NoError(t, d.Flush())
			case 4:
				require.NoError(t, d.Close())
				d = fx.open()
				requireContent(t, d, want, "after reopening")
			}
		}
		requireContent(t, d, want, "at the end")
		require.NoError(t, d.Close())
		require.Equal(t, before, fx.imageSum())
	})
}
