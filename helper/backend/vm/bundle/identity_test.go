package bundle

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// identityImage writes a 4 MiB cloud-layout image (so its middle lies
// outside the first and last MiB) and returns its path.
func identityImage(t *testing.T) string {
	t.Helper()
	g := cloudLayout(RootLabel)
	g.sectors = 8192
	return writeImage(t, t.TempDir(), RootImageName, g.build(t))
}

func identityOf(t *testing.T, path string) string {
	t.Helper()
	img, err := inspectFile(t, path)
	require.NoError(t, err)
	return img.Identity.String()
}

// rewriteAt overwrites path at off with b and puts its mtime back, so that
// only the content tells the change.
func rewriteAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.Chtimes(path, st.ModTime(), st.ModTime()))
}

func TestIdentityStableAcrossReopen(t *testing.T) {
	path := identityImage(t)
	first := identityOf(t, path)
	assert.Regexp(t, `^size=4194304 mtime=\S+ sha256=[0-9a-f]{64}$`, first)
	assert.Equal(t, first, identityOf(t, path))
}

func TestIdentityChanges(t *testing.T) {
	cases := map[string]func(t *testing.T, path string){
		"first MiB rewritten, mtime put back": func(t *testing.T, path string) {
			rewriteAt(t, path, 300*SectorSize, []byte("new bundle"))
		},
		"last MiB rewritten, mtime put back": func(t *testing.T, path string) {
			rewriteAt(t, path, 4<<20-SectorSize-100, []byte("new bundle"))
		},
		"size changed, mtime put back": func(t *testing.T, path string) {
			st, err := os.Stat(path)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(path, st.Size()+SectorSize))
			require.NoError(t, os.Chtimes(path, st.ModTime(), st.ModTime()))
		},
		"touched": func(t *testing.T, path string) {
			later := time.Now().Add(time.Hour)
			require.NoError(t, os.Chtimes(path, later, later))
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			path := identityImage(t)
			before := identityOf(t, path)
			change(t, path)
			assert.NotEqual(t, before, identityOf(t, path))
		})
	}
}

// TestIdentityMissesMiddleEditWithMtimeForcedBack pins the documented
// trade-off: a block in the middle of the image, outside the sampled ends
// and the superblocks, rewritten with the mtime put back, goes unseen.
func TestIdentityMissesMiddleEditWithMtimeForcedBack(t *testing.T) {
	path := identityImage(t)
	before := identityOf(t, path)
	rewriteAt(t, path, 2<<20+12345, []byte("edited in place"))
	assert.Equal(t, before, identityOf(t, path))
}

// TestIdentitySeesAMountInTheMiddle: a filesystem whose superblock lies
// outside both sampled MiBs still changes the identity when its superblock
// changes (as a read-write mount's write time does), mtime put back.
func TestIdentitySeesAMountInTheMiddle(t *testing.T) {
	sb := ext4SB(RootLabel, 4096*SectorSize)
	sb.roCompat = 0 // no checksum to redo after the edit
	g := testGPT{sectors: 16384, entries: 128, parts: []testPartition{
		{number: 1, typ: LinuxFilesystem, first: 6000, last: 10095, sb: &sb},
	}}
	path := writeImage(t, t.TempDir(), RootImageName, g.build(t))
	before := identityOf(t, path)
	rewriteAt(t, path, 6000*SectorSize+SuperblockOffset+0x30, []byte{1, 2, 3, 4}) // s_wtime
	assert.NotEqual(t, before, identityOf(t, path))
}
