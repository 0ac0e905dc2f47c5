package virtiofs

import (
	"errors"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
)

// cachedTimeout is how long the guest keeps entries and attributes of a
// Cached device (files that do not change while the guest runs).
const cachedTimeout = 24 * time.Hour

// fileSystem is one session's FUSE file system (go-fuse's RawFileSystem)
// over the export layer of package hostfs: every node is a p9.File of it,
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

func newFileSystem(root p9.File, opts Options) *fileSystem {
	return &fileSystem{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		t:             newTable(root, opts.MaxNodes, opts.MaxHandles),
		cached:        opts.Cached,
		noOpen:        opts.NoOpen,
	}
}

func (*fileSystem) String() string { return "cowork-vmm" }

// status converts an error of the export layer to a FUSE status.
func status(err error) fuse.Status {
	if err == nil {
		return fuse.OK
	}
	var le linux.Errno
	if errors.As(err, &le) {
		return fuse.Status(le)
	}
	var se syscall.Errno
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

// fillAttr converts the export layer's attributes; the inode number is the
// layer's QID path (the host inode mixed with its device), stable across
// lookups as tools like git expect.
func fillAttr(out *fuse.Attr, qid p9.QID, a p9.Attr) {
	*out = fuse.Attr{
		Ino:       qid.Path,
		Size:      a.Size,
		Blocks:    a.Blocks,
		Atime:     a.ATimeSeconds,
		Atimensec: uint32(a.ATimeNanoSeconds),
		Mtime:     a.MTimeSeconds,
		Mtimensec: uint32(a.MTimeNanoSeconds),
		Ctime:     a.CTimeSeconds,
		Ctimensec: uint32(a.CTimeNanoSeconds),
		Mode:      uint32(a.Mode),
		Nlink:     uint32(a.NLink),
		Owner:     fuse.Owner{Uid: uint32(a.UID), Gid: uint32(a.GID)},
		Rdev:      uint32(a.RDev),
		Blksize:   uint32(a.BlockSize),
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
	_, child, err := p.file.Walk([]string{name})
	if errors.Is(err, linux.ENFILE) {
		return f.lookupHeld(p, name, out)
	}
	if err != nil {
		return status(err)
	}
	key, qid, attr, err := hostfs.Identify(child)
	if err != nil {
		_ = child.Close()
		return status(err)
	}
	id, st := f.t.add(key, child, uint32(attr.Mode))
	if !st.Ok() {
		return st
	}
	f.fillEntry(out, id, qid, attr)
	return fuse.OK
}

// lookupHeld answers a lookup of name in p, with the descriptor budget
// spent, from the node the guest already holds for it (its kernel
// revalidating an entry it knows): the name's key is had without opening
// it, and the node's own file gives the attributes. ENFILE when the guest
// holds no node for it (a new node needs a descriptor).
func (f *fileSystem) lookupHeld(p *node, name string, out *fuse.EntryOut) fuse.Status {
	key, err := hostfs.ChildKey(p.file, name)
	if err != nil {
		return status(err)
	}
	n, ok := f.t.lookupByKey(key)
	if !ok {
		return fuse.Status(syscall.ENFILE)
	}
	defer f.t.putNode(n)
	got, qid, attr, err := hostfs.Identify(n.file)
	if err != nil {
		return status(err)
	}
	id, ok := f.t.relookup(key)
	if !ok || got != key {
		return fuse.Status(syscall.ENFILE) // forgotten or replaced meanwhile
	}
	f.fillEntry(out, id, qid, attr)
	return fuse.OK
}

// fillEntry fills a lookup's reply for node id.
func (f *fileSystem) fillEntry(out *fuse.EntryOut, id uint64, qid p9.QID, attr p9.Attr) {
	*out = fuse.EntryOut{NodeId: id}
	out.SetEntryTimeout(f.timeout())
	out.SetAttrTimeout(f.timeout())
	fillAttr(&out.Attr, qid, attr)
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

func (f *fileSystem) attrOut(file p9.File, out *fuse.AttrOut) fuse.Status {
	_, qid, attr, err := hostfs.Identify(file)
	if err != nil {
		return status(err)
	}
	out.SetTimeout(f.timeout())
	fillAttr(&out.Attr, qid, attr)
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
	valid, attr := setAttrFor(in)
	if err := n.file.SetAttr(valid, attr); err != nil {
		return status(err)
	}
	return f.attrOut(n.file, out)
}

func setAttrFor(in *fuse.SetAttrIn) (p9.SetAttrMask, p9.SetAttr) {
	v := in.Valid
	valid := p9.SetAttrMask{
		Permissions:        v&fuse.FATTR_MODE != 0,
		UID:                v&fuse.FATTR_UID != 0,
		GID:                v&fuse.FATTR_GID != 0,
		Size:               v&fuse.FATTR_SIZE != 0,
		ATime:              v&(fuse.FATTR_ATIME|fuse.FATTR_ATIME_NOW) != 0,
		MTime:              v&(fuse.FATTR_MTIME|fuse.FATTR_MTIME_NOW) != 0,
		ATimeNotSystemTime: v&fuse.FATTR_ATIME != 0 && v&fuse.FATTR_ATIME_NOW == 0,
		MTimeNotSystemTime: v&fuse.FATTR_MTIME != 0 && v&fuse.FATTR_MTIME_NOW == 0,
	}
	attr := p9.SetAttr{
		Permissions:      p9.FileMode(in.Mode),
		UID:              p9.UID(in.Uid),
		GID:              p9.GID(in.Gid),
		Size:             in.Size,
		ATimeSeconds:     in.Atime,
		ATimeNanoSeconds: uint64(in.Atimensec),
		MTimeSeconds:     in.Mtime,
		MTimeNanoSeconds: uint64(in.Mtimensec),
	}
	return valid, attr
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
		Blocks: s.Blocks, Bfree: s.BlocksFree, Bavail: s.BlocksAvailable,
		Files: s.Files, Ffree: s.FilesFree,
		Bsize: s.BlockSize, Frsize: s.BlockSize, NameLen: s.NameLength,
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
