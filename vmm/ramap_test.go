package vmm

import (
	"bytes"
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestAnonymousRAMIsHugePageAligned(t *testing.T) {
	for _, size := range []uint64{pageSize, 3 << 20, 64 << 20} {
		host, err := mapAnonymousRAM(size)
		require.NoError(t, err)
		assert.Len(t, host, int(size))
		assert.Zero(t, uintptr(unsafe.Pointer(&host[0]))%hugePageSize, "%d bytes: 2 MiB aligned", size)
		host[0], host[size-1] = 1, 2 // mapped, writable, to the last byte
		require.NoError(t, unmapRAM(host))
	}
}

// imageFile writes a sparse memory image of size bytes after a header of
// offset bytes, with data at the given offsets of the image.
func imageFile(t *testing.T, offset, size int64, data map[int64][]byte) *os.File {
	t.Helper()
	f, err := os.Create(t.TempDir() + "/mem")
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	_, err = f.WriteAt(bytes.Repeat([]byte{0xAA}, int(offset)), 0) // not guest RAM
	require.NoError(t, err)
	require.NoError(t, f.Truncate(offset+size))
	for at, b := range data {
		_, err := f.WriteAt(b, offset+at)
		require.NoError(t, err)
	}
	return f
}

func TestMemoryFromImageReadsTheImage(t *testing.T) {
	const offset, size = 8192, 6 << 20
	data := map[int64][]byte{0: []byte("first page"), 3<<20 + 5: []byte("across a huge page"), size - 4: []byte("last")}
	f := imageFile(t, offset, 2*size, data)
	_, err := f.WriteAt([]byte("second region"), offset+size)
	require.NoError(t, err)
	regions := []MemoryRegion{{GPA: 0, Size: size}, {GPA: 1 << 32, Size: size}}
	m, err := NewMemoryFromImage(regions, MemoryImage{FD: int(f.Fd()), Offset: offset})
	require.NoError(t, err)
	for at, want := range data {
		got := make([]byte, len(want))
		require.NoError(t, m.ReadAt(got, uint64(at)))
		assert.Equal(t, want, got, "at %#x", at)
	}
	zero := make([]byte, 4096)
	require.NoError(t, m.ReadAt(zero, 1<<20))
	assert.Equal(t, make([]byte, 4096), zero, "a hole reads as zeros")
	second := make([]byte, len("second region"))
	require.NoError(t, m.ReadAt(second, 1<<32))
	assert.Equal(t, "second region", string(second), "the second region's bytes follow the first's in the image")

	require.NoError(t, m.WriteAt([]byte("guest write"), 0))
	require.NoError(t, m.Close())
	back := make([]byte, len("first page"))
	_, err = f.ReadAt(back, offset)
	require.NoError(t, err)
	assert.Equal(t, "first page", string(back), "the guest's writes never reach the image")
}

func TestMemoryFromImageRefusesAShortImage(t *testing.T) {
	f := imageFile(t, 4096, 4096, map[int64][]byte{0: []byte("x")})
	_, err := NewMemoryFromImage([]MemoryRegion{{GPA: 0, Size: 1 << 20}}, MemoryImage{FD: int(f.Fd()), Offset: 4096})
	assert.ErrorContains(t, err, "guest RAM is 1048576", "an image shorter than guest RAM (mapped, it would fault when touched)")
}

// RAM restored from an image on a tmpfs too small for its holes is read
// into anonymous memory instead of mapped: touching a hole of a private
// mapping there would take a tmpfs page, and fail (SIGBUS) when the tmpfs
// is full. The memory then holds the image and needs the file no more.
func TestMemoryFromImageOnAFullTmpfsIsCopied(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	const size = 16 << 20
	f, err := os.Create(dir + "/mem")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(size))
	data := map[int64][]byte{0: []byte("first"), 5<<20 + 3: []byte("middle"), size - 4: []byte("last")}
	for at, b := range data {
		_, err := f.WriteAt(b, at)
		require.NoError(t, err)
	}
	m, err := NewMemoryFromImage([]MemoryRegion{{GPA: 0, Size: 8 << 20}, {GPA: 1 << 32, Size: 8 << 20}}, MemoryImage{FD: int(f.Fd())})
	require.NoError(t, err)
	defer m.Close()
	require.Nil(t, m.image, "copied into anonymous memory, not mapped from the file")
	require.NoError(t, f.Truncate(0)) // the file no longer matters
	for at, want := range data {
		got := make([]byte, len(want))
		gpa := uint64(at)
		if at >= 8<<20 {
			gpa = 1<<32 + uint64(at) - 8<<20
		}
		require.NoError(t, m.ReadAt(got, gpa))
		require.Equal(t, want, got)
	}
	hole := make([]byte, pageSize)
	require.NoError(t, m.ReadAt(hole, 3<<20))
	require.Equal(t, make([]byte, pageSize), hole)
}
