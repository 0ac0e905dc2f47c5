package blk

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

func TestConfigSpace(t *testing.T) {
	f := newImage(t, testImageSize)
	g := startGuest(t, newDevice(t, f, Options{}), virtiotest.Options{})
	read32 := func(off uint64) uint32 {
		var b [4]byte
		g.drv.ReadConfig(off, b[:])
		return binary.LittleEndian.Uint32(b[:])
	}
	var capacity [8]byte
	g.drv.ReadConfig(cfgCapacity, capacity[:])
	require.EqualValues(t, testImageSize/SectorSize, binary.LittleEndian.Uint64(capacity[:]))
	// Drivers read a 64-bit field as two 32-bit halves.
	require.EqualValues(t, testImageSize/SectorSize, uint64(read32(0))|uint64(read32(4))<<32)
	require.EqualValues(t, SizeMax, read32(cfgSizeMax))
	require.EqualValues(t, SegMax, read32(cfgSegMax))
	require.EqualValues(t, BlockSize, read32(cfgBlkSize))
	require.EqualValues(t, MaxDiscardSectors, read32(cfgMaxDiscardSectors))
	require.EqualValues(t, 1, read32(cfgMaxDiscardSeg))
	require.EqualValues(t, DiscardAlignment, read32(cfgDiscardAlignment))
	require.EqualValues(t, MaxDiscardSectors, read32(cfgMaxWZSectors))
	require.EqualValues(t, 1, read32(cfgMaxWZSeg))
	var b [1]byte
	g.drv.ReadConfig(cfgWZMayUnmap, b[:])
	require.EqualValues(t, 1, b[0])
	g.drv.ReadConfig(cfgWriteback, b[:])
	require.EqualValues(t, 1, b[0])

	// Writes are ignored.
	g.drv.WriteConfig(cfgCapacity, make([]byte, 8))
	g.drv.ReadConfig(cfgCapacity, capacity[:])
	require.EqualValues(t, testImageSize/SectorSize, binary.LittleEndian.Uint64(capacity[:]))
}

func TestFeatures(t *testing.T) {
	rw := newDevice(t, newImage(t, 4096), Options{})
	want := FeatureSizeMax | FeatureSegMax | FeatureBlkSize | FeatureFlush | FeatureDiscard | FeatureWriteZeroes
	require.Equal(t, want, rw.Features())
	g := startGuest(t, rw, virtiotest.Options{})
	require.Equal(t, want, g.drv.Features()&want, "negotiated")
	require.Equal(t, virtio.DeviceTypeBlock, g.drv.ReadReg(virtio.MMIODeviceID))

	ro := newDevice(t, newImage(t, 4096), Options{ReadOnly: true})
	require.Equal(t, FeatureSizeMax|FeatureSegMax|FeatureBlkSize|FeatureFlush|FeatureRO, ro.Features())
	var discard [12]byte
	ro.ReadConfig(cfgMaxDiscardSectors, discard[:])
	require.Equal(t, make([]byte, 12), discard[:], "a read-only disk advertises no discard")
}

// Any offset and length the guest picks is safe; bytes past the space
// are left as they were.
func TestConfigOddOffsets(t *testing.T) {
	dev := newDevice(t, newImage(t, 3<<20), Options{})
	full := make([]byte, configSize)
	dev.ReadConfig(0, full)
	for _, tc := range []struct {
		offset uint64
		n      int
	}{
		{1, 1}, {3, 4}, {7, 2}, {configSize - 1, 1}, {configSize - 2, 8},
		{configSize, 4}, {configSize + 1, 4}, {1 << 32, 4}, {1 << 63, 8}, {^uint64(0), 8}, {0, 256}, {5, 0},
	} {
		data := bytes.Repeat([]byte{0xaa}, tc.n)
		dev.ReadConfig(tc.offset, data)
		for i := range data {
			if off := tc.offset + uint64(i); tc.offset < configSize && off < configSize {
				require.Equal(t, full[off], data[i], "offset %d+%d", tc.offset, i)
			} else {
				require.EqualValues(t, 0xaa, data[i], "offset %d+%d outside the space was touched", tc.offset, i)
			}
		}
	}
	require.EqualValues(t, 3<<20/SectorSize, binary.LittleEndian.Uint64(full))
}

// TestSignalResized: the driver is told to read the configuration space
// again (config interrupt, new generation); before activation nothing
// happens.
func TestSignalResized(t *testing.T) {
	f := newImage(t, testImageSize)
	dev := newDevice(t, f, Options{})
	dev.SignalResized() // not active: ignored
	g := startGuest(t, dev, virtiotest.Options{})
	gen := g.drv.ReadReg(virtio.MMIOConfigGeneration)
	g.drv.AckInterrupts()
	dev.SignalResized()
	require.NotZero(t, g.drv.ReadReg(virtio.MMIOInterruptStatus)&2, "config change interrupt")
	require.NotEqual(t, gen, g.drv.ReadReg(virtio.MMIOConfigGeneration))
}
