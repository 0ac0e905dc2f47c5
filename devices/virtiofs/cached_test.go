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

// Every reply that gives the guest an entry, attributes or an open file
// carries the device's cache policy: Options.Cached gives day-long entry
// and attribute lifetimes and keeps the guest's page cache (and directory
// listings) across opens; an uncached device gives lifetimes of a second
// (CoherentTimeout) and no FOPEN_KEEP_CACHE, so an open after a host edit
// reads it, and an open through a name the host replaced is ESTALE (the
// guest then looks the name up again).
func TestCachePolicyInEveryReply(t *testing.T) {
	for _, cached := range []bool{false, true} {
		name := "uncached"
		if cached {
			name = "cached"
		}
		t.Run(name, func(t *testing.T) {
			r := newRig(t, Options{Cached: cached})
			dir := r.export(t, "e1", false, map[string]string{"f": "old", "d/g": ""})
			init := r.initSession(t)
			require.NotZero(t, init.Flags&uint32(fuse.CAP_CACHE_SYMLINKS), "the guest may cache symlink targets (they never change in place)")
			e1 := r.walk(t, "e1")
			wantSecs := uint64(CoherentTimeout / time.Second)
			if cached {
				wantSecs = 24 * 60 * 60
			}
			entry := func(what string, e fuse.EntryOut, errno syscall.Errno) {
				t.Helper()
				require.Zero(t, errno, what)
				require.Equal(t, wantSecs, e.EntryValid, "%s: entry lifetime", what)
				require.Equal(t, wantSecs, e.AttrValid, "%s: attribute lifetime", what)
				require.Zero(t, e.EntryValidNsec+e.AttrValidNsec, what)
			}
			attr := func(what string, a fuse.AttrOut, errno syscall.Errno) {
				t.Helper()
				require.Zero(t, errno, what)
				require.Equal(t, wantSecs, a.AttrValid, "%s: attribute lifetime", what)
				require.Zero(t, a.AttrValidNsec, what)
			}
			// want: the flags of a Cached device; a read-only open of a
			// file is never flushed, whatever the device.
			open := func(what string, flags, want uint32, readOnlyFile bool) {
				t.Helper()
				if !cached {
					want = 0
				}
				if readOnlyFile {
					want |= fuse.FOPEN_NOFLUSH
				}
				require.Equal(t, want, flags, "%s: open flags", what)
			}

			e, errno := r.lookup(t, e1, "f")
			entry("lookup", e, errno)
			a, errno := r.getattr(t, e.NodeId)
			attr("getattr", a, errno)
			a, errno = r.setattr(t, e.NodeId, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o644})
			attr("setattr", a, errno)
			o, errno := r.openOut(t, e.NodeId, syscall.O_RDONLY)
			require.Zero(t, errno)
			open("open", o.OpenFlags, fuse.FOPEN_KEEP_CACHE, true)
			ow, errno := r.openOut(t, e.NodeId, syscall.O_WRONLY)
			require.Zero(t, errno)
			open("open for writing", ow.OpenFlags, fuse.FOPEN_KEEP_CACHE, false)
			od, errno := r.opendir(t, e1)
			require.Zero(t, errno)
			open("opendir", od.OpenFlags, fuse.FOPEN_KEEP_CACHE|fuse.FOPEN_CACHE_DIR, false)
			c, errno := r.create(t, e1, "created", syscall.O_RDWR, 0o644)
			entry("create", c.EntryOut, errno)
			open("create", c.OpenOut.OpenFlags, fuse.FOPEN_KEEP_CACHE, false)

			// A name the host does not have: a negative entry the guest
			// keeps as long as its names (Cached), else ENOENT.
			missing, errno := r.lookup(t, e1, "not-there")
			if cached {
				require.Zero(t, errno, "lookup of a missing name")
				require.Zero(t, missing.NodeId, "a negative entry")
				require.Equal(t, wantSecs, missing.EntryValid, "negative entry lifetime")
			} else {
				require.Equal(t, syscall.ENOENT, errno, "lookup of a missing name")
			}
			m, errno := r.mkdir(t, e1, "made", 0o755)
			entry("mkdir", m, errno)
			n, errno := r.mknod(t, e1, "fifo", syscall.S_IFIFO|0o644, 0)
			entry("mknod", n, errno)
			s, errno := r.symlink(t, e1, "lnk", "f")
			entry("symlink", s, errno)
			l, errno := r.link(t, e.NodeId, e1, "hard")
			entry("link", l, errno)
			for _, ent := range r.listDir(t, e1, od.Fh, opReaddirplus, 4096) {
				if ent.name != "." && ent.name != ".." {
					entry("readdirplus "+ent.name, ent.entry, 0)
				}
			}
			root, errno := r.getattr(t, fuse.FUSE_ROOT_ID)
			attr("getattr of the export list", root, errno)

			if cached {
				return
			}
			// Uncached: a host edit is what the guest reads and sees next.
			require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("edited on the host"), 0o644))
			data, errno := r.read(t, e.NodeId, o.Fh, 0, 100)
			require.Zero(t, errno)
			require.Equal(t, "edited on the host", string(data))
			a, errno = r.getattr(t, e.NodeId)
			require.Zero(t, errno)
			require.EqualValues(t, len("edited on the host"), a.Attr.Size)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "d", "new-on-host"), nil, 0o644))
			_, errno = r.lookup(t, r.walk(t, "e1", "d"), "new-on-host")
			require.Zero(t, errno, "a name made on the host is found at once")

			// An editor's save on the host: a new file renamed over doc
			// (f has a hard link by now, so it would stay linked).
			require.NoError(t, os.WriteFile(filepath.Join(dir, "doc"), []byte("before the save"), 0o644))
			doc, errno := r.lookup(t, e1, "doc")
			require.Zero(t, errno)
			before, errno := r.openOut(t, doc.NodeId, syscall.O_RDONLY)
			require.Zero(t, errno)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "doc.new"), []byte("saved by an editor"), 0o644))
			require.NoError(t, os.Rename(filepath.Join(dir, "doc.new"), filepath.Join(dir, "doc")))
			_, errno = r.openOut(t, doc.NodeId, syscall.O_RDONLY)
			require.Equal(t, syscall.ESTALE, errno, "an open of the replaced file, through the guest's cached name")
			saved, errno := r.lookup(t, e1, "doc")
			require.Zero(t, errno)
			require.NotEqual(t, doc.NodeId, saved.NodeId, "the name's new file is a new node")
			after, errno := r.openOut(t, saved.NodeId, syscall.O_RDONLY)
			require.Zero(t, errno)
			data, errno = r.read(t, saved.NodeId, after.Fh, 0, 100)
			require.Zero(t, errno)
			require.Equal(t, "saved by an editor", string(data))
			// A handle opened before the save still reads the old file,
			// as on a local file system.
			data, errno = r.read(t, doc.NodeId, before.Fh, 0, 100)
			require.Zero(t, errno)
			require.Equal(t, "before the save", string(data))
		})
	}
}
