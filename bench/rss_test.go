package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

func TestParseStatus(t *testing.T) {
	m, err := ParseStatus(readFixture(t, "status"))
	require.NoError(t, err)
	assert.Equal(t, int64(30900), m.RSSKiB)
	assert.Equal(t, int64(33000), m.HWMKiB)

	_, err = ParseStatus([]byte("Name:\tkthreadd\nState:\tS\n"))
	assert.ErrorContains(t, err, "no VmRSS")
	_, err = ParseStatus([]byte("VmRSS:\t12 MB\n"))
	assert.ErrorContains(t, err, `want "N kB"`)
	_, err = ParseStatus([]byte("VmRSS:\t-5 kB\n"))
	assert.Error(t, err)
}

func TestParseSmapsRollup(t *testing.T) {
	r, err := ParseSmapsRollup(readFixture(t, "smaps_rollup"))
	require.NoError(t, err)
	assert.Equal(t, Rollup{RSSKiB: 30896, PSSKiB: 30796, AnonKiB: 23716}, r)
	_, err = ParseSmapsRollup([]byte("Pss: 1 kB\n"))
	assert.ErrorContains(t, err, "no Rss")
	_, err = ParseSmapsRollup([]byte("Rss: lots kB\n"))
	assert.Error(t, err)
}

func TestParseSmapsAndGuestMapping(t *testing.T) {
	maps, err := ParseSmaps(readFixture(t, "smaps"))
	require.NoError(t, err)
	require.Len(t, maps, 9)
	assert.Equal(t, "/usr/local/bin/cowork-vmm", maps[0].Path)
	assert.Equal(t, "/path with spaces/lib.so", maps[8].Path)
	assert.Equal(t, "[heap]", maps[5].Path)
	assert.False(t, maps[5].Anonymous(), "[heap] and [stack] are not guest RAM")

	var total int64
	for _, m := range maps {
		total += m.RSSKiB
	}
	rollup, err := ParseSmapsRollup(readFixture(t, "smaps_rollup"))
	require.NoError(t, err)
	assert.Equal(t, rollup.RSSKiB, total, "the mappings add up to the rollup")

	g, ok := GuestMapping(maps, 512<<20)
	require.True(t, ok)
	assert.Equal(t, uint64(0x7f0000000000), g.Start)
	assert.Equal(t, int64(20480), g.RSSKiB)

	_, ok = GuestMapping(maps, 256<<20)
	assert.False(t, ok, "no mapping of the guest's size (the 512 MiB one is too large to be it)")
	g, ok = GuestMapping(maps, 1<<30)
	require.True(t, ok, "an anonymous 1 GiB mapping matches a 1 GiB guest")
	assert.Equal(t, uint64(0x7f1000000000), g.Start)
}

func TestGuestMappingPrefersTheTightestFit(t *testing.T) {
	maps := []Mapping{
		{Start: 1, SizeKiB: 512*1024 + 2048, RSSKiB: 1},
		{Start: 2, SizeKiB: 512*1024 + 4, RSSKiB: 2}, // qemu: RAM plus a guard page
		{Start: 3, SizeKiB: 512 * 1024, RSSKiB: 3, Path: "/memfd:other"},
	}
	g, ok := GuestMapping(maps, 512<<20)
	require.True(t, ok)
	assert.Equal(t, uint64(2), g.Start)
}

func TestParseSmapsRejectsBadNumbers(t *testing.T) {
	_, err := ParseSmaps([]byte("00400000-00401000 r-xp 00000000 fe:00 1 /bin/x\nRss: x kB\n"))
	assert.Error(t, err)
	maps, err := ParseSmaps([]byte("garbage\nRss: 4 kB\n"))
	require.NoError(t, err, "lines before the first mapping are ignored")
	assert.Empty(t, maps)
}

func TestReadMemoryOfThisProcess(t *testing.T) {
	m, err := ReadMemory(os.Getpid(), 0)
	require.NoError(t, err)
	assert.Positive(t, m.RSSKiB)
	assert.GreaterOrEqual(t, m.HWMKiB, m.RSSKiB)
	assert.Equal(t, m.RSSKiB, m.VMMKiB, "no guest: all of the RSS is the process's own")
}
