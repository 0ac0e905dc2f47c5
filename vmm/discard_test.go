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

// TestDiscardGivesPagesBack: a discarded range reads as zeros, its pages
// are no longer resident, its neighbours keep their bytes; a range that
// is unaligned or not in one RAM region is refused and changes nothing.
func TestDiscardGivesPagesBack(t *testing.T) {
	requireHostPages4K(t)
	m, err := NewMemory([]MemoryRegion{{0, 16 * pageSize}, {0x100000, 4 * pageSize}})
	require.NoError(t, err)
	defer m.Close()
	fill := bytes.Repeat([]byte{0xa5}, 16*pageSize)
	require.NoError(t, m.WriteAt(fill, 0))

	n, err := m.Discard(4*pageSize, 8*pageSize)
	require.NoError(t, err)
	require.Equal(t, uint64(8*pageSize), n)
	got := make([]byte, 16*pageSize)
	require.NoError(t, m.ReadAt(got, 0))
	assert.Equal(t, fill[:4*pageSize], got[:4*pageSize], "the pages before")
	assert.Equal(t, make([]byte, 8*pageSize), got[4*pageSize:12*pageSize], "the discarded pages read as zeros")
	assert.Equal(t, fill[12*pageSize:], got[12*pageSize:], "the pages after")

	require.NoError(t, m.WriteAt(fill[:4*pageSize], 4*pageSize))
	_, err = m.Discard(4*pageSize, 4*pageSize)
	require.NoError(t, err)
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
		_, err := m.Discard(c.gpa, c.n)
		assert.Error(t, err, "[%#x, +%#x)", c.gpa, c.n)
	}
	require.NoError(t, m.ReadAt(got[:pageSize], 0))
	assert.Equal(t, fill[:pageSize], got[:pageSize], "a refused discard changes nothing")
}

// requireHostPages4K skips a test whose page accounting assumes 4 KiB host
// pages (mincore and pagemap count host pages) on a host with larger ones.
func requireHostPages4K(t *testing.T) {
	t.Helper()
	if n := os.Getpagesize(); n != pageSize {
		t.Skipf("this test counts 4 KiB host pages; this host's are %d bytes (TestDiscardWholeHostPages covers it)", n)
	}
}

// TestDiscardWholeHostPages: on a host with 16 or 64 KiB pages, a discard
// gives back only the host pages wholly inside the range, and says so.
func TestDiscardWholeHostPages(t *testing.T) {
	const base = 0x10000 // a 64 KiB-aligned mapping
	buf := make([]byte, 0x40000)
	at := func(off, n int) []byte { return buf[off : off+n] }
	start := uintptr(unsafe.Pointer(&buf[0]))
	for _, c := range []struct {
		name           string
		hostPage       uint64
		off, n         int
		wantOff, wantN int
	}{
		{"4 KiB host", 4096, 0x1000, 0x3000, 0x1000, 0x3000},
		{"16 KiB, aligned", 0x4000, 0x4000, 0x8000, 0x4000, 0x8000},
		{"16 KiB, a page and its neighbours' parts", 0x4000, 0x3000, 0x6000, 0x4000, 0x4000},
		{"16 KiB, inside one page", 0x4000, 0x5000, 0x2000, 0, 0},
		{"64 KiB, a 2 MiB report", 0x10000, 0x10000, 0x20000, 0x10000, 0x20000},
		{"64 KiB, one guest page", 0x10000, 0x10000, 0x1000, 0, 0},
	} {
		off := c.off + int((base-start%base)%base) // the same offsets from an aligned address
		if off+c.n > len(buf) {
			t.Fatalf("%s: test buffer too small", c.name)
		}
		got := wholeHostPages(at(off, c.n), c.hostPage)
		if c.wantN == 0 {
			assert.Empty(t, got, c.name)
			continue
		}
		wantStart := uintptr(unsafe.Pointer(&buf[0])) + uintptr(off-c.off+c.wantOff)
		assert.Equal(t, wantStart, uintptr(unsafe.Pointer(&got[0])), c.name)
		assert.Equal(t, c.wantN, len(got), c.name)
	}
}
