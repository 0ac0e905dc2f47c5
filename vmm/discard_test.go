package vmm

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestDiscardGivesPagesBack: a discarded range reads as zeros, its pages
// are no longer resident, its neighbours keep their bytes; a range that
// is unaligned or not in one RAM region is refused and changes nothing.
func TestDiscardGivesPagesBack(t *testing.T) {
	m, err := NewMemory([]MemoryRegion{{0, 16 * pageSize}, {0x100000, 4 * pageSize}})
	require.NoError(t, err)
	defer m.Close()
	fill := bytes.Repeat([]byte{0xa5}, 16*pageSize)
	require.NoError(t, m.WriteAt(fill, 0))

	require.NoError(t, m.Discard(4*pageSize, 8*pageSize))
	got := make([]byte, 16*pageSize)
	require.NoError(t, m.ReadAt(got, 0))
	assert.Equal(t, fill[:4*pageSize], got[:4*pageSize], "the pages before")
	assert.Equal(t, make([]byte, 8*pageSize), got[4*pageSize:12*pageSize], "the discarded pages read as zeros")
	assert.Equal(t, fill[12*pageSize:], got[12*pageSize:], "the pages after")

	require.NoError(t, m.WriteAt(fill[:4*pageSize], 4*pageSize))
	require.NoError(t, m.Discard(4*pageSize, 4*pageSize))
	host, err := m.Slice(0, 16*pageSize)
	require.NoError(t, err)
	resident := make([]byte, 16)
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&host[0])), uintptr(len(host)), uintptr(unsafe.Pointer(&resident[0])))
	require.Zero(t, errno, "mincore")
	assert.Zero(t, resident[4]&1, "a discarded page is no longer resident")
	assert.NotZero(t, resident[0]&1, "an untouched neighbour still is")

	for _, c := range []struct{ gpa, n uint64 }{
		{pageSize / 2, pageSize},      // unaligned start
		{0, pageSize + 1},             // unaligned length
		{0, 0},                        // nothing
		{15 * pageSize, 2 * pageSize}, // past the region's end
		{0x80000, pageSize},           // in the hole
	} {
		assert.Error(t, m.Discard(c.gpa, c.n), "[%#x, +%#x)", c.gpa, c.n)
	}
	require.NoError(t, m.ReadAt(got[:pageSize], 0))
	assert.Equal(t, fill[:pageSize], got[:pageSize], "a refused discard changes nothing")
}
