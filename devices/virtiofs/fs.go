package virtiofs

import (
	"errors"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
)

// cachedTimeout is how long the guest keeps entries and attributes of a
// Cached device (files that do not change while the guest runs).
const cachedTimeout = 24 * time.Hour

// fileSystem is one session's FUSE file system (go-fuse's RawFileSystem)
// over the export layer of package hostfs: every node is a hostfs.Node,
// so virtio-fs inherits its confinement (openat2 beneath held directory
// descriptors, no symlink followed on the host), read-only exports,
// withdrawal (ESTALE) and set-id stripping. Operations the layer has no
// use for answer ENOSYS, which makes the guest kernel stop asking (xattrs,
// fallocate, lseek, copy_file_range, ioctl) or handle them itself (locks,
// access: virtiofs mounts use default_permissions).
type fileSystem struct {
	fuse.RawFileSystem // ENOSYS for everything not below
	t                  *table
	cached             bool
	noOpen             bool
}

func newFileSystem(root hostfs.Node, opts Options) *fileSystem {
	return fileSystemOver(newTable(root, opts.MaxNodes, opts.MaxHandles), opts)
}

// fileSystemOver returns a file system serving the nodes of t (a session
// restored from a snapshot goes on with the table it had).
func fileSystemOver(t *table, opts Options) *fileSystem {
	return &fileSystem{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		t:             t,
		cached:        opts.Cached,
		noOpen:        opts.NoOpen,
	}
}

func (*fileSystem) String() string { return "cowork-vmm" }

// status converts an error of the export layer (a unix.Errno) to a FUSE
// status.
func status(err error) fuse.Status {
	if err == nil {
		return fuse.OK
	}
	var se unix.Errno
	if errors.As(err, &se) {
		return fuse.Status(se)
	}
	return fuse.EIO
}

// CoherentTimeout is how long the guest keeps entries and attributes of
// a device that is not Cached (sessions, user folders): files the host
// changes while the guest runs. It is virtiofsd's default (cache=auto,
// what the official helper runs): a tree walk or git status asks the host
// once per file rather than once per look (several times faster), and a
// host change of names or attributes is seen within it. Contents are
// coherent at open: each open drops the guest's page cache, and an open
// through a name the host has since replaced gets the new file
// (checkStillLinked).
const CoherentTimeout = time.Second

// timeout is the entry and attribute lifetime the guest is given.
func (f *fileSystem) timeout() time.Duration {
	if f.cached {
		return cachedTimeout
	}
	return CoherentTimeout
}

// fillAttr converts the export layer's attributes; the inode number is
// the layer's (hostfs.GuestIno: the host inode mixed with its device),
// stable across lookups as tools like git expect.
func fillAttr(out *fuse.Attr, a hostfs.Attr) {
	st := &a.Stat
	*out = fuse.Attr{
		Ino:       a.Key.GuestIno(),
		Size:      uint64(st.Size),
		Blocks:    uint64(st.Blocks),
		Atime:     uint64(st.Atim.Sec),
		Atimensec: uint32(st.Atim.Nsec),
		Mtime:     uint64(st.Mtim.Sec),
		Mtimensec: uint32(st.Mtim.Nsec),
		Ctime:     uint64(st.Ctim.Sec),
		Ctimensec: uint32(st.Ctim.Nsec),
		Mode:      st.Mode,
		Nlink:     uint32(st.Nlink),
		Owner:     fuse.Owner{Uid: st.Uid, Gid: st.Gid},
		Rdev:      uint32(st.Rdev),
		Blksize:   uint32(st.Blksize),
	}
}

// lookup walks from the parent node to name and enters the child into the
// table (one more lookup of it), filling out.
func (f *fileSystem) lookup(parent uint64, name string, out *fuse.EntryOut) fuse.Status {
	p, st := f.t.node(parent)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(p)
	child, attr, err := p.file.Walk(name)
	if errors.Is(err, unix.ENFILE) {
		return f.lookupHeld(p, name, out)
	}
	if err != nil {
		return status(err)
	}
	id, st := f.t.add(attr.Key, child, attr.Stat.Mode)
	if !st.Ok() {
		return st
	}
	f.fillEntry(out, id, attr)
	return fuse.OK
}

// lookupHeld answers a lookup of name in p, with the descriptor budget
// spent, from the node the guest already holds for it (its kernel
// revalidating an entry it knows): the name's key is had without opening
// it, and the node's own file gives the attributes. ENFILE when the guest
// holds no node for it (a new node needs a descriptor).
func (f *fileSystem) lookupHeld(p *node, name string, out *fuse.EntryOut) fuse.Status {
	key, err := p.file.ChildKey(name)
	if err != nil {
		return status(err)
	}
	n, ok := f.t.lookupByKey(key)
	if !ok {
		return fuse.Status(syscall.ENFILE)
	}
	defer f.t.putNode(n)
	attr, err := n.file.Stat()
	if err != nil {
		return status(err)
	}
	id, ok := f.t.relookup(key)
	if !ok || attr.Key != key {
		return fuse.Status(syscall.ENFILE) // forgotten or replaced meanwhile
	}
	f.fillEntry(out, id, attr)
	return fuse.OK
}

// fillEntry fills a lookup's reply for node id.
func (f *fileSystem) fillEntry(out *fuse.EntryOut, id uint64, attr hostfs.Attr) {
	*out = fuse.EntryOut{NodeId: id}
	out.SetEntryTimeout(f.timeout())
	out.SetAttrTimeout(f.timeout())
	fillAttr(&out.Attr, attr)
}

// Lookup implements fuse.RawFileSystem. A name the host does not have gets, from a Cached device, a negative
// entry (node id 0) that the guest keeps for cachedTimeout, as it keeps
// the names it found: programs started from system directories probe many
// names that are not there (python3 tries each directory of its path for
// every module), and without it each probe of each run is a round trip to
// the host. Other devices answer ENOENT, so a file the host creates in a
// session is seen at the guest's next look.
func (f *fileSystem) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	st := f.lookup(h.NodeId, name, out)
	if st == fuse.ENOENT && f.cached {
		*out = fuse.EntryOut{}
		out.SetEntryTimeout(cachedTimeout)
		return fuse.OK
	}
	return st
}

// Forget implements fuse.RawFileSystem (FORGET and BATCH_FORGET).
func (f *fileSystem) Forget(nodeid, nlookup uint64) { f.t.forget(nodeid, nlookup) }

// GetAttr implements fuse.RawFileSystem.
func (f *fileSystem) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	n, st := f.t.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(n)
	return f.attrOut(n.file, out)
}

func (f *fileSystem) attrOut(file hostfs.Node, out *fuse.AttrOut) fuse.Status {
	attr, err := file.Stat()
	if err != nil {
		return status(err)
	}
	out.SetTimeout(f.timeout())
	fillAttr(&out.Attr, attr)
	return fuse.OK
}

// SetAttr implements fuse.RawFileSystem. The guest's ctime and
// KILL_SUIDGID bits need nothing: the layer sets ctime on any change and
// always clears set-id bits.
func (f *fileSystem) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	n, st := f.t.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(n)
	if err := n.file.SetAttr(setAttrFor(in)); err != nil {
		return status(err)
	}
	return f.attrOut(n.file, out)
}

// setAttrFor converts a SETATTR.
func setAttrFor(in *fuse.SetAttrIn) hostfs.SetAttr {
	v := in.Valid
	out := hostfs.SetAttr{
		Mode: in.Mode, UID: in.Uid, GID: in.Gid, Size: in.Size,
		ATime: hostfs.SetTime(v&fuse.FATTR_ATIME_NOW != 0, in.Atime, uint64(in.Atimensec)),
		MTime: hostfs.SetTime(v&fuse.FATTR_MTIME_NOW != 0, in.Mtime, uint64(in.Mtimensec)),
	}
	for _, b := range []struct{ fuse, set uint32 }{
		{fuse.FATTR_MODE, hostfs.SetMode}, {fuse.FATTR_UID, hostfs.SetUID}, {fuse.FATTR_GID, hostfs.SetGID},
		{fuse.FATTR_SIZE, hostfs.SetSize},
		{fuse.FATTR_ATIME | fuse.FATTR_ATIME_NOW, hostfs.SetATime},
		{fuse.FATTR_MTIME | fuse.FATTR_MTIME_NOW, hostfs.SetMTime},
	} {
		if v&b.fuse != 0 {
			out.Valid |= b.set
		}
	}
	return out
}

// StatFs implements fuse.RawFileSystem.
func (f *fileSystem) StatFs(_ <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	n, st := f.t.node(h.NodeId)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(n)
	s, err := n.file.StatFS()
	if err != nil {
		return status(err)
	}
	*out = fuse.StatfsOut{
		Blocks: s.Blocks, Bfree: s.Bfree, Bavail: s.Bavail,
		Files: s.Files, Ffree: s.Ffree,
		Bsize: uint32(s.Bsize), Frsize: uint32(s.Bsize), NameLen: uint32(s.Namelen),
	}
	return fuse.OK
}

// Readlink implements fuse.RawFileSystem.
func (f *fileSystem) Readlink(_ <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	n, st := f.t.node(h.NodeId)
	if !st.Ok() {
		return nil, st
	}
	defer f.t.putNode(n)
	target, err := n.file.Readlink()
	if err != nil {
		return nil, status(err)
	}
	return []byte(target), fuse.OK
}
