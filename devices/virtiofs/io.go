package virtiofs

import (
	"syscall"

	"math"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
)

// Open files and directories. An open is a clone of the node opened
// through the export layer, which opens only regular files and
// directories on the host (a FIFO's or socket's open never reaches the
// host: the guest kernel serves those itself). Reads and writes go
// straight between the host file and the chain's guest buffers when the
// device could map them (see device.go): the buf a READ gets and the
// segments a WRITE carries are guest memory.

// openFlags are the FOPEN flags of an open with flags (the guest's open
// flags): a Cached device lets the guest keep its page cache (and
// directory listings) across opens; otherwise each open drops what the
// guest cached, so an open after a host edit reads the edit
// (close-to-open). A read-only open is never flushed: our FLUSH has
// nothing to do (writes reach the host file at once), and each close
// would otherwise wait for a round trip to the host. A writable open
// keeps FLUSH, whose guest side first writes back the pages a shared
// mapping dirtied, so the host has them once close returns.
func (f *fileSystem) openFlags(flags uint32, dir bool) uint32 {
	var out uint32
	if !dir && flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		out |= fuse.FOPEN_NOFLUSH
	}
	if !f.cached {
		return out
	}
	if dir {
		return out | fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_CACHE_DIR
	}
	return out | fuse.FOPEN_KEEP_CACHE
}

// openNode opens a clone of node id's file, which must be a directory
// (dir) or not, and records it as a handle.
func (f *fileSystem) openNode(id uint64, flags uint32, dir bool) (uint64, fuse.Status) {
	n, st := f.t.node(id)
	if !st.Ok() {
		return 0, st
	}
	defer f.t.putNode(n)
	switch isDir := n.mode == fuse.S_IFDIR; {
	case dir && !isDir:
		return 0, fuse.ENOTDIR
	case !dir && isDir:
		return 0, fuse.Status(fuse.EISDIR)
	}
	clone, err := openClone(n.file, flags)
	if err != nil {
		return 0, status(err)
	}
	if st := f.checkStillLinked(clone, dir); !st.Ok() {
		_ = clone.Close()
		return 0, st
	}
	return f.t.open(clone, dir)
}

// openClone opens a clone of file with open(2) flags: the node keeps its
// own descriptor, and the clone is the caller's to close.
func openClone(file hostfs.Node, flags uint32) (hostfs.Node, error) {
	clone, err := file.Clone()
	if err != nil {
		return nil, err
	}
	if _, err := clone.Open(flags); err != nil {
		_ = clone.Close()
		return nil, err
	}
	return clone, nil
}

// checkStillLinked answers ESTALE for the open of a file of an uncached
// device that is no longer linked on the host: the guest reached it
// through a name it keeps for up to CoherentTimeout, and the host has
// since replaced that name (an editor's save renames a new file over the
// old) or removed it. The guest kernel retries an open that fails with
// ESTALE with a fresh lookup of every name (LOOKUP_REVAL), so it opens
// what the name is now. An open of the unlinked file by a path that
// needs no lookup (/proc/PID/fd/N) keeps failing with ESTALE, as over NFS.
func (f *fileSystem) checkStillLinked(file hostfs.Node, dir bool) fuse.Status {
	if f.cached || dir {
		return fuse.OK
	}
	attr, err := file.Stat()
	if err != nil {
		return status(err)
	}
	if attr.Stat.Nlink == 0 {
		return fuse.Status(syscall.ESTALE)
	}
	return fuse.OK
}

// Open implements fuse.RawFileSystem. A NoOpen device answers ENOSYS,
// which makes the guest kernel open its files without asking from then on
// (FUSE's "no open"): no OPEN and no RELEASE, two round trips saved for
// every file a program opens, while the guest keeps its page cache as
// KEEP_CACHE would. Its READs then name the node instead of a handle
// (readNode), a FLUSH or FSYNC is ENOSYS (nothing to flush: its files do
// not change), and a file the host does not let the helper read fails at
// the first read rather than at open.
func (f *fileSystem) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if f.noOpen {
		return fuse.ENOSYS
	}
	fh, st := f.openNode(in.NodeId, in.Flags, false)
	if !st.Ok() {
		return st
	}
	*out = fuse.OpenOut{Fh: fh, OpenFlags: f.openFlags(in.Flags, false)}
	return fuse.OK
}

// OpenDir implements fuse.RawFileSystem.
func (f *fileSystem) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	fh, st := f.openNode(in.NodeId, unix.O_RDONLY, true)
	if !st.Ok() {
		return st
	}
	*out = fuse.OpenOut{Fh: fh, OpenFlags: f.openFlags(in.Flags, true)}
	return fuse.OK
}

// Release implements fuse.RawFileSystem.
func (f *fileSystem) Release(_ <-chan struct{}, in *fuse.ReleaseIn) { f.t.release(in.Fh, false) }

// ReleaseDir implements fuse.RawFileSystem.
func (f *fileSystem) ReleaseDir(in *fuse.ReleaseIn) { f.t.release(in.Fh, true) }

// Read implements fuse.RawFileSystem. The read itself is deferred to the
// reply (readResult): go-fuse then hands it the reply's room as the
// chain's guest buffers, so one preadv fills the guest's pages straight
// from the host file, where a read into buf would be copied again
// whenever the room is more than one piece (a page-cache read is one
// buffer per page).
func (f *fileSystem) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if in.Offset > math.MaxInt64 {
		return nil, fuse.EINVAL
	}
	r := &readResult{f: f, fh: in.Fh, offset: int64(in.Offset), size: int(min(uint64(in.Size), uint64(len(buf))))}
	if f.unopened(in.Fh) {
		r.fh, r.nodeID = 0, in.NodeId
		return r, f.checkReadable(in.NodeId)
	}
	h, st := f.t.handle(in.Fh, false)
	if !st.Ok() {
		return nil, st
	}
	f.t.putHandle(h)
	return r, fuse.OK
}

// unopened says whether fh is the handle of a file the guest opened
// without asking (a NoOpen device: see Open). Handle ids start at 1.
func (f *fileSystem) unopened(fh uint64) bool { return f.noOpen && fh == 0 }

// checkReadable answers EISDIR for a READ of a directory and EINVAL for a
// READ of anything else that is not a regular file.
func (f *fileSystem) checkReadable(id uint64) fuse.Status {
	n, st := f.t.node(id)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(n)
	switch n.mode {
	case fuse.S_IFREG:
		return fuse.OK
	case fuse.S_IFDIR:
		return fuse.Status(syscall.EISDIR)
	}
	return fuse.EINVAL
}

// readResult is a READ to be done into the reply's buffers. It names the
// handle (or, for a file opened without asking, the node) rather than
// holding it: a RELEASE or FORGET in between makes it EBADF or ESTALE,
// and nothing is left open if go-fuse drops the result unread.
type readResult struct {
	f      *fileSystem
	fh     uint64
	nodeID uint64 // set instead of fh for a file opened without asking
	offset int64
	size   int
}

// Size implements fuse.ReadResult: the most the read returns.
func (r *readResult) Size() int { return r.size }

// Done implements fuse.ReadResult.
func (r *readResult) Done() {}

// Bytes implements fuse.ReadResult, for a reply go-fuse builds in buf.
func (r *readResult) Bytes(buf []byte) ([]byte, fuse.Status) {
	if len(buf) < r.size {
		buf = make([]byte, r.size)
	}
	n, st := r.Readv([][]byte{buf[:r.size]})
	return buf[:n], st
}

// Readv reads into dst, the reply's room (go-fuse's withReadv).
func (r *readResult) Readv(dst [][]byte) (int, fuse.Status) {
	if r.nodeID != 0 {
		return r.readNode(dst)
	}
	h, st := r.f.t.handle(r.fh, false)
	if !st.Ok() {
		return 0, st
	}
	defer r.f.t.putHandle(h)
	return readvStatus(h.file, dst, r.offset)
}

// readNode reads into dst from the node of a file opened without asking.
func (r *readResult) readNode(dst [][]byte) (int, fuse.Status) {
	n, st := r.f.t.node(r.nodeID)
	if !st.Ok() {
		return 0, st
	}
	defer r.f.t.putNode(n)
	file, transient, st := r.f.t.reader(n)
	if !st.Ok() {
		return 0, st
	}
	if transient {
		defer file.Close()
	}
	return readvStatus(file, dst, r.offset)
}

// readvStatus is readv with a FUSE status: a short read is a success.
func readvStatus(file hostfs.Node, dst [][]byte, offset int64) (int, fuse.Status) {
	n, err := file.ReadvAt(dst, offset)
	if err != nil && n == 0 {
		return 0, status(err)
	}
	return n, fuse.OK
}

// Writev implements fuse.RawFileSystem: the guest's segments are written
// in order, in one pwritev.
func (f *fileSystem) Writev(_ <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	h, st := f.t.handle(in.Fh, false)
	if !st.Ok() {
		return 0, st
	}
	defer f.t.putHandle(h)
	if in.Offset > math.MaxInt64 {
		return 0, fuse.EINVAL
	}
	n, err := h.file.WritevAt(data, int64(in.Offset))
	if err != nil && n == 0 {
		return 0, status(err)
	}
	return uint32(n), fuse.OK
}

// Flush implements fuse.RawFileSystem: nothing is buffered on the host.
func (f *fileSystem) Flush(_ <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	if f.unopened(in.Fh) {
		return fuse.ENOSYS // the guest stops sending FLUSH
	}
	h, st := f.t.handle(in.Fh, false)
	if st.Ok() {
		f.t.putHandle(h)
	}
	return st
}

// Fsync implements fuse.RawFileSystem.
func (f *fileSystem) Fsync(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if f.unopened(in.Fh) {
		return fuse.ENOSYS // the guest stops sending FSYNC
	}
	return f.fsync(in.Fh, false)
}

// FsyncDir implements fuse.RawFileSystem.
func (f *fileSystem) FsyncDir(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return f.fsync(in.Fh, true)
}

func (f *fileSystem) fsync(fh uint64, dir bool) fuse.Status {
	h, st := f.t.handle(fh, dir)
	if !st.Ok() {
		return st
	}
	defer f.t.putHandle(h)
	return status(h.file.Sync())
}

// direntMode is a directory entry's type as FUSE wants it (S_IFMT bits),
// from the export layer's DT_ type (a directory, a symlink, or a regular
// file for the rest: the guest learns a FIFO's or socket's real type from
// its attributes); a DT_ value is its S_IFMT bits shifted down by 12.
func direntMode(t uint8) uint32 { return uint32(t) << 12 }

// readdirPlusShare divides a READDIRPLUS's size into what the layer is
// asked for: each entry carries a 128-byte entry besides its name.
const readdirPlusShare = 5

// ReadDir implements fuse.RawFileSystem. The offset is the host's own
// directory position (see package hostfs), so nothing is cached between
// requests.
func (f *fileSystem) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	ents, st := f.readdir(in, in.Size)
	for _, d := range ents {
		if !out.AddDirEntry(fuse.DirEntry{Mode: direntMode(d.Type), Name: d.Name, Ino: d.Ino, Off: d.Offset}) {
			break
		}
	}
	return st
}

// ReadDirPlus implements fuse.RawFileSystem: each entry but "." and ".."
// is also looked up (one more lookup of its node, which the kernel
// counts); an entry whose lookup fails goes without attributes (node id 0).
func (f *fileSystem) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	ents, st := f.readdir(in, in.Size/readdirPlusShare)
	for _, d := range ents {
		e := out.AddDirLookupEntry(fuse.DirEntry{Mode: direntMode(d.Type), Name: d.Name, Ino: d.Ino, Off: d.Offset})
		if e == nil {
			break
		}
		if d.Name == "." || d.Name == ".." {
			continue
		}
		if !f.lookup(in.NodeId, d.Name, e).Ok() {
			*e = fuse.EntryOut{}
			continue
		}
		out.FixMode(e.Attr.Mode)
	}
	return st
}

func (f *fileSystem) readdir(in *fuse.ReadIn, count uint32) ([]hostfs.Dirent, fuse.Status) {
	h, st := f.t.handle(in.Fh, true)
	if !st.Ok() {
		return nil, st
	}
	defer f.t.putHandle(h)
	ents, err := h.file.Readdir(in.Offset, count)
	return ents, status(err)
}
