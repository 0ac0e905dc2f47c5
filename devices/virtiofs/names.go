package virtiofs

import (
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
)

// Operations that create, remove or rename names. Each runs on the parent
// directory's node through the export layer (which checks the name and
// refuses a read-only export), then looks the new name up to answer with
// its entry. The guest's uid and gid are not used: files belong to the
// helper's user on the host (see package hostfs).

// parentFile returns the directory node id, for the caller's use until it
// calls putNode.
func (f *fileSystem) parentFile(id uint64) (*node, fuse.Status) {
	n, st := f.t.node(id)
	if !st.Ok() {
		return nil, st
	}
	if n.mode != fuse.S_IFDIR {
		f.t.putNode(n)
		return nil, fuse.ENOTDIR
	}
	return n, fuse.OK
}

// Mkdir implements fuse.RawFileSystem.
func (f *fileSystem) Mkdir(_ <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	dir, st := f.parentFile(in.NodeId)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(dir)
	if _, err := dir.file.Mkdir(name, in.Mode); err != nil {
		return status(err)
	}
	return f.lookup(in.NodeId, name, out)
}

// Mknod implements fuse.RawFileSystem: FIFOs, sockets and (through the
// kernel's fallback when CREATE fails) regular files; device nodes are
// refused by the layer.
func (f *fileSystem) Mknod(_ <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	dir, st := f.parentFile(in.NodeId)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(dir)
	if _, err := dir.file.Mknod(name, in.Mode); err != nil {
		return status(err)
	}
	return f.lookup(in.NodeId, name, out)
}

// Symlink implements fuse.RawFileSystem. The target is only stored: no
// symlink is ever followed on the host.
func (f *fileSystem) Symlink(_ <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	dir, st := f.parentFile(h.NodeId)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(dir)
	if _, err := dir.file.Symlink(target, name); err != nil {
		return status(err)
	}
	return f.lookup(h.NodeId, name, out)
}

// Link implements fuse.RawFileSystem (the layer refuses a link across
// exports).
func (f *fileSystem) Link(_ <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	dir, st := f.parentFile(in.NodeId)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(dir)
	target, st := f.t.node(in.Oldnodeid)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(target)
	if err := dir.file.Link(target.file, name); err != nil {
		return status(err)
	}
	return f.lookup(in.NodeId, name, out)
}

// Unlink implements fuse.RawFileSystem.
func (f *fileSystem) Unlink(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return f.unlink(h.NodeId, name, 0)
}

// Rmdir implements fuse.RawFileSystem.
func (f *fileSystem) Rmdir(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return f.unlink(h.NodeId, name, unix.AT_REMOVEDIR)
}

func (f *fileSystem) unlink(parent uint64, name string, flags uint32) fuse.Status {
	dir, st := f.parentFile(parent)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(dir)
	return status(dir.file.UnlinkAt(name, flags))
}

// Rename implements fuse.RawFileSystem. RENAME2's flags (noreplace,
// exchange, whiteout) are not supported: ENOSYS makes the guest kernel
// answer EINVAL for them from then on, as for a file system without
// renameat2. A node the guest holds for the renamed file learns its new
// place (the layer uses it for a symlink's times).
func (f *fileSystem) Rename(_ <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	if in.Flags != 0 {
		return fuse.ENOSYS
	}
	oldDir, st := f.parentFile(in.NodeId)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(oldDir)
	newDir, st := f.parentFile(in.Newdir)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(newDir)
	if err := oldDir.file.RenameAt(oldName, newDir.file, newName); err != nil {
		return status(err)
	}
	f.noteRenamed(newDir.file, newName)
	return fuse.OK
}

// noteRenamed tells the node the guest holds for dir/name, if any, its new
// parent and name.
func (f *fileSystem) noteRenamed(dir hostfs.Node, name string) {
	moved, attr, err := dir.Walk(name)
	if err != nil {
		return
	}
	defer moved.Close()
	if n, ok := f.t.lookupByKey(attr.Key); ok {
		n.file.Renamed(dir, name)
		f.t.putNode(n)
	}
}

// Create implements fuse.RawFileSystem: the file is created and opened in
// one step (O_EXCL on the host: the kernel sends CREATE only for a name it
// found missing), then looked up for its node.
func (f *fileSystem) Create(_ <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	dir, st := f.parentFile(in.NodeId)
	if !st.Ok() {
		return st
	}
	defer f.t.putNode(dir)
	created, _, err := dir.file.Create(name, in.Flags, in.Mode)
	if err != nil {
		return status(err)
	}
	fh, st := f.t.open(created, false)
	if !st.Ok() {
		return st
	}
	if st := f.lookup(in.NodeId, name, &out.EntryOut); !st.Ok() {
		f.t.release(fh, false)
		return st
	}
	out.OpenOut = fuse.OpenOut{Fh: fh, OpenFlags: f.openFlags(in.Flags, false)}
	return fuse.OK
}
