package arm64

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// imageSpec describes a synthetic Image.
type imageSpec struct {
	textOffset, imageSize, flags uint64
	body                         int // bytes after the header
}

// buildImage returns an Image with a valid header and a patterned body.
func buildImage(s imageSpec) []byte {
	b := make([]byte, ImageHeaderSize+s.body)
	copy(b, []byte{0x4d, 0x5a, 0, 0x91}) // "MZ" + add x13, x18, #0x16: an EFI-stub kernel's code0
	binary.LittleEndian.PutUint64(b[0x08:], s.textOffset)
	binary.LittleEndian.PutUint64(b[0x10:], s.imageSize)
	binary.LittleEndian.PutUint64(b[0x18:], s.flags)
	binary.LittleEndian.PutUint32(b[ImageMagicOffset:], ImageMagic)
	for i := ImageHeaderSize; i < len(b); i++ {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// defaultImage is what a 6.1 kernel looks like: text_offset 0, 4K pages,
// placement anywhere (flags 0xa).
func defaultImage() imageSpec {
	return imageSpec{imageSize: 0x30_0000, flags: 0xa, body: 0x1_0000}
}

func TestParseImageHeader(t *testing.T) {
	h, err := ParseImageHeader(buildImage(defaultImage()))
	require.NoError(t, err)
	require.Equal(t, ImageHeader{ImageSize: 0x30_0000, Flags: 0xa, PageSize: 4096, PlaceAnywhere: true}, h)

	for flags, page := range map[uint64]uint64{0: 0, 2: 4096, 4: 16384, 6: 65536, 0xf0: 0} {
		s := defaultImage()
		s.flags, s.textOffset = flags, 0x8_0000
		h, err := ParseImageHeader(buildImage(s))
		require.NoError(t, err, "flags %#x", flags)
		require.Equal(t, page, h.PageSize, "flags %#x", flags)
		require.False(t, h.PlaceAnywhere)
		require.Equal(t, uint64(0x8_0000), h.TextOffset)
		require.Equal(t, flags, h.Flags, "reserved bits kept")
	}
}

// TestParseImageHeaderRejects checks each malformed header is refused
// with ErrBadImage and a message naming the problem.
func TestParseImageHeaderRejects(t *testing.T) {
	cases := map[string]struct {
		image []byte
		want  string
	}{
		"empty":         {nil, "shorter than the 64-byte header"},
		"short":         {buildImage(defaultImage())[:63], "shorter than the 64-byte header"},
		"gzip":          {[]byte{0x1f, 0x8b, 8, 0}, "gzip-compressed"},
		"no magic":      {make([]byte, 64), "magic 0x0"},
		"image_size 0":  {buildImage(imageSpec{flags: 0xa, body: 0x100}), "older than v3.17"},
		"file too long": {buildImage(imageSpec{imageSize: 0x100, flags: 0xa, body: 0x100}), "smaller than the 0x140-byte file"},
		"huge":          {buildImage(imageSpec{imageSize: MaxRAM + 1, flags: 0xa}), "exceeds the largest guest RAM"},
		"text_offset":   {buildImage(imageSpec{textOffset: 2 << 20, imageSize: 0x1000, flags: 0xa}), "text_offset 0x200000"},
		"unaligned":     {buildImage(imageSpec{textOffset: 0x80, imageSize: 0x1000, flags: 0xa}), "text_offset 0x80"},
		"huge offset":   {buildImage(imageSpec{textOffset: 1 << 63, imageSize: 0x1000, flags: 0xa}), "text_offset"},
		"big-endian":    {buildImage(imageSpec{imageSize: 0x1000, flags: 0xb}), "big-endian"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseImageHeader(c.image)
			require.ErrorIs(t, err, ErrBadImage)
			require.ErrorContains(t, err, c.want)
		})
	}
}

// FuzzImageHeader feeds arbitrary bytes as a kernel: the parser never
// panics, and what it accepts is safe to place (offset and size bounded,
// the file within image_size), and PrepareBoot on it never writes outside
// RAM or over the DTB slot.
func FuzzImageHeader(f *testing.F) {
	f.Add(buildImage(defaultImage()))
	f.Add(buildImage(imageSpec{textOffset: 0x8_0000, imageSize: 0x1000, flags: 0x2, body: 0x20}))
	f.Add(buildImage(imageSpec{imageSize: 0x40, flags: 0xb}))
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, image []byte) {
		h, err := ParseImageHeader(image)
		if err != nil {
			require.ErrorIs(t, err, ErrBadImage)
			return
		}
		require.Less(t, h.TextOffset, MaxTextOffset)
		require.Zero(t, h.TextOffset%0x1000)
		require.GreaterOrEqual(t, h.ImageSize, uint64(len(image)))
		require.LessOrEqual(t, h.ImageSize, MaxRAM)
		require.Contains(t, []uint64{0, 4096, 16384, 65536}, h.PageSize)

		const memBytes = 8 << 20
		mem := newFakeMemory(memBytes)
		s, err := PrepareBoot(mem, BootConfig{MemBytes: memBytes, CPUs: 1, Kernel: image, Initrd: []byte{1}})
		if err != nil {
			return
		}
		require.LessOrEqual(t, s.KernelEnd, s.InitrdAddr)
		require.LessOrEqual(t, s.InitrdAddr+s.InitrdSize, s.DTBAddr)
		require.LessOrEqual(t, s.DTBAddr+DTBMaxSize, RAMBase+memBytes)
	})
}
