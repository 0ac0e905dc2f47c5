package hostfs

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// heapAlloc is the live heap after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// bigDir exports a directory of n entries with longish names, on a tmpfs
// when /dev/shm is one (creating them on a slow disk takes seconds).
func bigDir(t *testing.T, h *harness, name string, n int) map[string]bool {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "p9fs-test-")
	if err != nil {
		dir = filepath.Join(h.base, name)
		require.NoError(t, os.Mkdir(dir, 0o755))
	} else {
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	require.NoError(t, h.exports.Add(name, dir, false))
	want := make(map[string]bool, n)
	for i := range n {
		entry := fmt.Sprintf("entry-with-a-longish-name-%06d", i)
		require.NoError(t, os.WriteFile(filepath.Join(dir, entry), nil, 0o644))
		want[entry] = true
	}
	return want
}

// listFrom reads a whole listing through d with count-byte requests.
func listFrom(t *testing.T, d Node, count uint32) []string {
	t.Helper()
	var names []string
	offset := uint64(0)
	for {
		ents, err := d.Readdir(offset, count)
		require.NoError(t, err)
		if len(ents) == 0 {
			return names
		}
		for _, e := range ents {
			if e.Name != "." && e.Name != ".." {
				names = append(names, e.Name)
			}
			offset = e.Offset
		}
	}
}

// Issue #15 defect 4: every fid cached its directory's whole listing
// (254 MiB of host heap for 200 fids × 20 000 entries). Listings are
// streamed from the host now: the heap stays flat however many fids list.
func TestReaddirHoldsNoListingPerFid(t *testing.T) {
	const fids, entries = 200, 20_000
	// The budget: what 200 fids cost without any listing (their structs
	// and descriptors), plus slack for the runtime — far below a single
	// cached listing of this directory (~3 MiB).
	const budget = 2 << 20
	h := newHarness(t)
	want := bigDir(t, h, "big", entries)
	root := h.attach(t, "big")

	before := heapAlloc()
	held := make([]Node, 0, fids)
	for range fids {
		d, err := root.Clone()
		require.NoError(t, err)
		_, err = d.Open(unix.O_RDONLY)
		require.NoError(t, err)
		ents, err := d.Readdir(0, 4096) // a first page, then the fid waits
		require.NoError(t, err)
		require.NotEmpty(t, ents)
		held = append(held, d)
	}
	grown := int64(heapAlloc()) - int64(before)
	t.Logf("HEAPFIGURE %d fids × %d entries, each read one page: heap grew %.2f MiB (budget %d MiB)",
		fids, entries, float64(grown)/(1<<20), budget>>20)
	assert.Less(t, grown, int64(budget))

	// Every held fid still lists the directory whole and exactly once,
	// interleaved with the others, by resuming at the host's offsets.
	got := listFrom(t, held[0], 8192)
	assert.Len(t, got, entries)
	seen := map[string]bool{}
	for _, n := range got {
		assert.True(t, want[n], "unexpected entry %q", n)
		assert.False(t, seen[n], "entry %q listed twice", n)
		seen[n] = true
	}
	assert.Len(t, listFrom(t, held[fids-1], 64<<10), entries)
	for _, d := range held {
		require.NoError(t, d.Close())
	}
}

// A guest's count is clamped: one reply never carries more than
// maxReaddirBytes of entries, whatever it asks for.
func TestReaddirClampsCount(t *testing.T) {
	h := newHarness(t)
	bigDir(t, h, "big", 40_000) // ~2.1 MB of 9P entries
	d := directWalk(t, h.exports, "big")
	_, err := d.Open(unix.O_RDONLY)
	require.NoError(t, err)
	ents, err := d.Readdir(0, 0xFFFF_FFFF)
	require.NoError(t, err)
	size := 0
	for _, e := range ents {
		size += int(direntSize(e.Name))
	}
	assert.LessOrEqual(t, size, maxReaddirBytes)
	assert.Greater(t, size, maxReaddirBytes-300, "filled up to the cap")
	// A nonsense offset from the guest is an empty page, not an error.
	ents, err = d.Readdir(1<<63+5, 4096)
	require.NoError(t, err)
	assert.Empty(t, ents)
}

// A listing gives each entry the inode number and type a walk to it
// gives (the guest matches them: FUSE's READDIRPLUS, 9P's QIDs), in an
// ordinary export and in a single-file export's directory.
func TestReaddirAgreesWithWalk(t *testing.T) {
	h := newHarness(t)
	dir := h.export(t, "rw", false, map[string]string{"f": "x", "d/g": "y"})
	require.NoError(t, os.Symlink("f", filepath.Join(dir, "l")))
	require.NoError(t, h.exports.AddFile("one", filepath.Join(dir, "f"), false))
	wantType := map[uint32]uint8{unix.S_IFREG: unix.DT_REG, unix.S_IFDIR: unix.DT_DIR, unix.S_IFLNK: unix.DT_LNK}
	for export, names := range map[string][]string{"rw": {"d", "f", "l"}, "one": {"f"}} {
		root := h.attach(t, export)
		d := walk(t, root)
		_, err := d.Open(unix.O_RDONLY)
		require.NoError(t, err)
		ents, err := d.Readdir(0, 4096)
		require.NoError(t, err)
		got := map[string]Dirent{}
		for _, e := range ents {
			got[e.Name] = e
		}
		for _, name := range names {
			n, attr, err := root.Walk(name)
			require.NoError(t, err)
			_ = n.Close()
			e, ok := got[name]
			require.True(t, ok, "%s lists %s", export, name)
			assert.Equal(t, attr.Key.GuestIno(), e.Ino, "%s/%s", export, name)
			assert.Equal(t, wantType[attr.Stat.Mode&unix.S_IFMT], e.Type, "%s/%s", export, name)
		}
	}
}
