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
