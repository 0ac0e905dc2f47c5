package virtiofs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// Issue #42: the installed SDK binary is an immutable single-file export
// (hostfs.Exports.AddImmutableFile) on the cached device, with the
// options the kvm backend's system device has. The guest gets day-long
// entry and attribute lifetimes for the export's directory and its file,
// keeps its page cache across opens (FOPEN_KEEP_CACHE, or no OPEN at all:
// Linux keeps the cache of a file it opens without asking), and what it
// reads is the file as shared: replaced on the host (a re-download renamed
// over it), the export still serves the old inode, so the pages the guest
// cached and the ones it reads later never mix two files. The helper
// shares the new file as a new export (helper/sdk.go).
func TestImmutableFileExportOnTheCachedDevice(t *testing.T) {
	for name, opts := range map[string]Options{
		"cached":     {Cached: true},
		"system-dev": {Cached: true, NoOpen: true, ListNamesOnly: true},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, opts)
			dir := filepath.Join(r.dir, "sdk", "1.0.0")
			require.NoError(t, os.MkdirAll(dir, 0o755))
			path := filepath.Join(dir, "claude")
			const shared = "the binary as installed"
			require.NoError(t, os.WriteFile(path, []byte(shared), 0o755))
			require.NoError(t, r.exports.AddImmutableFile("e1", path))
			r.initSession(t)

			day := uint64(24 * time.Hour / time.Second)
			entry := func(what string, e fuse.EntryOut, errno syscall.Errno) {
				t.Helper()
				require.Zero(t, errno, what)
				require.Equal(t, day, e.EntryValid, "%s: entry lifetime", what)
				require.Equal(t, day, e.AttrValid, "%s: attribute lifetime", what)
			}
			view, errno := r.lookup(t, fuse.FUSE_ROOT_ID, "e1")
			entry("lookup of the export", view, errno)
			f, errno := r.lookup(t, view.NodeId, "claude")
			entry("lookup of the file", f, errno)
			require.EqualValues(t, len(shared), f.Attr.Size)

			// The client re-downloads the version: a new file renamed
			// over the old one, longer.
			tmp := path + ".download"
			require.NoError(t, os.WriteFile(tmp, []byte("a re-downloaded binary, longer than the first"), 0o755))
			require.NoError(t, os.Rename(tmp, path))

			a, errno := r.getattr(t, f.NodeId)
			require.Zero(t, errno)
			require.Equal(t, day, a.AttrValid, "getattr: attribute lifetime")
			require.EqualValues(t, len(shared), a.Attr.Size, "getattr: the size of the file as shared")
			require.Equal(t, f.Attr.Ino, a.Attr.Ino, "getattr: the inode as shared")
			again, errno := r.lookup(t, view.NodeId, "claude")
			entry("lookup again", again, errno)
			require.Equal(t, f.NodeId, again.NodeId, "a fresh lookup finds the file as shared")
			require.EqualValues(t, len(shared), again.Attr.Size)

			for i := range 2 { // the second open must keep what the first cached
				require.Equal(t, shared, readWhole(t, r, f.NodeId, opts.NoOpen), "read %d", i)
			}
			od, errno := r.opendir(t, view.NodeId)
			require.Zero(t, errno)
			require.Equal(t, uint32(fuse.FOPEN_KEEP_CACHE|fuse.FOPEN_CACHE_DIR), od.OpenFlags, "opendir flags")
			ents := r.listDir(t, view.NodeId, od.Fh, opReaddir, 4096)
			require.Equal(t, []string{".", "..", "claude"}, names(ents))
			require.Equal(t, f.Attr.Ino, ents[2].ino, "the listing shows the file as shared")
		})
	}
}

// readWhole reads a file of the export as the guest does: without an OPEN
// on a NoOpen device (which must answer ENOSYS, so the guest stops asking
// and keeps its cache), else through an open that must keep the cache.
func readWhole(t *testing.T, r *rig, node uint64, noOpen bool) string {
	t.Helper()
	if noOpen {
		_, errno := r.open(t, node, syscall.O_RDONLY)
		require.Equal(t, syscall.ENOSYS, errno, "OPEN of a NoOpen device")
		data, errno := r.read(t, node, 0, 0, 4096)
		require.Zero(t, errno)
		return string(data)
	}
	o, errno := r.openOut(t, node, syscall.O_RDONLY)
	require.Zero(t, errno)
	require.Equal(t, uint32(fuse.FOPEN_KEEP_CACHE|fuse.FOPEN_NOFLUSH), o.OpenFlags, "open flags")
	defer r.release(t, node, o.Fh, opRelease)
	data, errno := r.read(t, node, o.Fh, 0, 4096)
	require.Zero(t, errno)
	return string(data)
}
