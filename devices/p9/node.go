package p9

import (
	"errors"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
)

// The adapter between hugelgupf/p9's vocabulary and the export layer's
// (package hostfs): a fid's p9.File is a nodeFile over a hostfs.Node, and
// every method translates arguments, results and errors, nothing more.

// ExportsAttacher returns the Attacher that serves x: each attach is x's
// virtual root (hostfs.Exports.Root), whose children are the export names
// (the guest's aname).
func ExportsAttacher(x *hostfs.Exports) p9lib.Attacher { return exportsAttacher{x} }

type exportsAttacher struct{ x *hostfs.Exports }

func (a exportsAttacher) Attach() (p9lib.File, error) { return &nodeFile{n: a.x.Root()}, nil }

// nodeFile is the p9.File of one hostfs.Node.
type nodeFile struct {
	n hostfs.Node
}

var _ p9lib.File = (*nodeFile)(nil)

// nodeOf returns the Node behind one of our files, or nil for another
// file (which the layer refuses, EXDEV).
func nodeOf(f p9lib.File) hostfs.Node {
	if nf, ok := f.(*nodeFile); ok {
		return nf.n
	}
	return nil
}

// p9err gives the server the layer's errno as linux.Errno: it would fold
// some unix.Errno values into others (ENOTEMPTY into EEXIST, say).
func p9err(err error) error {
	var e unix.Errno
	if errors.As(err, &e) {
		return linux.Errno(e)
	}
	return err
}

// qidOf is the QID of a node: its type, and the inode number the guest
// sees (hostfs.GuestIno).
func qidOf(a hostfs.Attr) p9lib.QID {
	return p9lib.QID{Type: p9lib.FileMode(a.Stat.Mode).QIDType(), Path: a.Key.GuestIno()}
}

// attrOf converts a node's host attributes. The attach root has only a
// mode, a link count and a size.
func attrOf(a hostfs.Attr) (p9lib.AttrMask, p9lib.Attr) {
	st := &a.Stat
	attr := p9lib.Attr{
		Mode:             p9lib.FileMode(st.Mode),
		UID:              p9lib.UID(st.Uid),
		GID:              p9lib.GID(st.Gid),
		NLink:            p9lib.NLink(st.Nlink),
		RDev:             p9lib.Dev(st.Rdev),
		Size:             uint64(st.Size),
		BlockSize:        uint64(st.Blksize),
		Blocks:           uint64(st.Blocks),
		ATimeSeconds:     uint64(st.Atim.Sec),
		ATimeNanoSeconds: uint64(st.Atim.Nsec),
		MTimeSeconds:     uint64(st.Mtim.Sec),
		MTimeNanoSeconds: uint64(st.Mtim.Nsec),
		CTimeSeconds:     uint64(st.Ctim.Sec),
		CTimeNanoSeconds: uint64(st.Ctim.Nsec),
	}
	if a.Key == hostfs.RootKey {
		return p9lib.AttrMask{Mode: true, NLink: true, Size: true}, attr
	}
	return p9lib.AttrMask{
		Mode: true, NLink: true, UID: true, GID: true, RDev: true,
		ATime: true, MTime: true, CTime: true, INo: true, Size: true, Blocks: true,
	}, attr
}

// setAttrOf converts a Tsetattr.
func setAttrOf(valid p9lib.SetAttrMask, attr p9lib.SetAttr) hostfs.SetAttr {
	out := hostfs.SetAttr{
		Mode: uint32(attr.Permissions), UID: uint32(attr.UID), GID: uint32(attr.GID), Size: attr.Size,
		ATime: hostfs.SetTime(!valid.ATimeNotSystemTime, attr.ATimeSeconds, attr.ATimeNanoSeconds),
		MTime: hostfs.SetTime(!valid.MTimeNotSystemTime, attr.MTimeSeconds, attr.MTimeNanoSeconds),
	}
	for _, b := range []struct {
		set bool
		bit uint32
	}{
		{valid.Permissions, hostfs.SetMode}, {valid.UID, hostfs.SetUID}, {valid.GID, hostfs.SetGID},
		{valid.Size, hostfs.SetSize}, {valid.ATime, hostfs.SetATime}, {valid.MTime, hostfs.SetMTime},
	} {
		if b.set {
			out.Valid |= b.bit
		}
	}
	return out
}

// Walk implements p9.File: a clone, or one name (the server walks one at
// a time).
func (f *nodeFile) Walk(names []string) ([]p9lib.QID, p9lib.File, error) {
	switch len(names) {
	case 0:
		n, err := f.n.Clone()
		if err != nil {
			return nil, nil, p9err(err)
		}
		return nil, &nodeFile{n: n}, nil
	case 1:
		n, a, err := f.n.Walk(names[0])
		if err != nil {
			return nil, nil, p9err(err)
		}
		return []p9lib.QID{qidOf(a)}, &nodeFile{n: n}, nil
	}
	return nil, nil, linux.EINVAL
}

// WalkGetAttr implements p9.File.
func (f *nodeFile) WalkGetAttr(names []string) ([]p9lib.QID, p9lib.File, p9lib.AttrMask, p9lib.Attr, error) {
	qids, nf, err := f.Walk(names)
	if err != nil {
		return nil, nil, p9lib.AttrMask{}, p9lib.Attr{}, err
	}
	_, valid, attr, err := nf.GetAttr(p9lib.AttrMaskAll)
	if err != nil {
		_ = nf.Close()
		return nil, nil, p9lib.AttrMask{}, p9lib.Attr{}, err
	}
	return qids, nf, valid, attr, nil
}

// StatFS implements p9.File.
func (f *nodeFile) StatFS() (p9lib.FSStat, error) {
	st, err := f.n.StatFS()
	if err != nil {
		return p9lib.FSStat{}, p9err(err)
	}
	return p9lib.FSStat{
		Type:            uint32(st.Type),
		BlockSize:       uint32(st.Bsize),
		Blocks:          st.Blocks,
		BlocksFree:      st.Bfree,
		BlocksAvailable: st.Bavail,
		Files:           st.Files,
		FilesFree:       st.Ffree,
		FSID:            uint64(uint32(st.Fsid.Val[0])) | uint64(uint32(st.Fsid.Val[1]))<<32,
		NameLength:      uint32(st.Namelen),
	}, nil
}

// GetAttr implements p9.File: every attribute we have, whatever req asks
// (returning more than asked is allowed).
func (f *nodeFile) GetAttr(p9lib.AttrMask) (p9lib.QID, p9lib.AttrMask, p9lib.Attr, error) {
	a, err := f.n.Stat()
	if err != nil {
		return p9lib.QID{}, p9lib.AttrMask{}, p9lib.Attr{}, p9err(err)
	}
	valid, attr := attrOf(a)
	return qidOf(a), valid, attr, nil
}

// SetAttr implements p9.File.
func (f *nodeFile) SetAttr(valid p9lib.SetAttrMask, attr p9lib.SetAttr) error {
	return p9err(f.n.SetAttr(setAttrOf(valid, attr)))
}

// Close implements p9.File.
func (f *nodeFile) Close() error { return p9err(f.n.Close()) }

// Open implements p9.File (9P2000.L's open flags are Linux's).
func (f *nodeFile) Open(flags p9lib.OpenFlags) (p9lib.QID, uint32, error) {
	a, err := f.n.Open(uint32(flags))
	if err != nil {
		return p9lib.QID{}, 0, p9err(err)
	}
	return qidOf(a), 0, nil
}

// ReadAt implements p9.File.
func (f *nodeFile) ReadAt(p []byte, offset int64) (int, error) {
	n, err := f.n.ReadvAt([][]byte{p}, offset)
	return n, p9err(err)
}

// WriteAt implements p9.File.
func (f *nodeFile) WriteAt(p []byte, offset int64) (int, error) {
	n, err := f.n.WritevAt([][]byte{p}, offset)
	return n, p9err(err)
}

// SetXattr implements p9.File.
func (f *nodeFile) SetXattr(name string, data []byte, flags p9lib.XattrFlags) error {
	return p9err(f.n.SetXattr(name, data, int(flags)))
}

// GetXattr implements p9.File.
func (f *nodeFile) GetXattr(name string) ([]byte, error) {
	b, err := f.n.GetXattr(name)
	return b, p9err(err)
}

// ListXattrs implements p9.File.
func (f *nodeFile) ListXattrs() ([]string, error) {
	names, err := f.n.ListXattrs()
	return names, p9err(err)
}

// RemoveXattr implements p9.File.
func (f *nodeFile) RemoveXattr(name string) error { return p9err(f.n.RemoveXattr(name)) }

// FSync implements p9.File.
func (f *nodeFile) FSync() error { return p9err(f.n.Sync()) }

// Lock implements p9.File: local-only semantics (see package hostfs).
func (f *nodeFile) Lock(int, p9lib.LockType, p9lib.LockFlags, uint64, uint64, string) (p9lib.LockStatus, error) {
	if err := f.n.Check(); err != nil {
		return p9lib.LockStatusError, p9err(err)
	}
	return p9lib.LockStatusOK, nil
}

// Create implements p9.File. The guest's uid and gid are not used (see
// package hostfs), here and in Mkdir, Symlink and Mknod.
func (f *nodeFile) Create(name string, flags p9lib.OpenFlags, perm p9lib.FileMode, _ p9lib.UID, _ p9lib.GID) (p9lib.File, p9lib.QID, uint32, error) {
	n, a, err := f.n.Create(name, uint32(flags), uint32(perm))
	if err != nil {
		return nil, p9lib.QID{}, 0, p9err(err)
	}
	return &nodeFile{n: n}, qidOf(a), 0, nil
}

// Mkdir implements p9.File.
func (f *nodeFile) Mkdir(name string, perm p9lib.FileMode, _ p9lib.UID, _ p9lib.GID) (p9lib.QID, error) {
	return qidAnswer(f.n.Mkdir(name, uint32(perm)))
}

// Symlink implements p9.File.
func (f *nodeFile) Symlink(target, name string, _ p9lib.UID, _ p9lib.GID) (p9lib.QID, error) {
	return qidAnswer(f.n.Symlink(target, name))
}

// Mknod implements p9.File (device numbers are never used: see package
// hostfs).
func (f *nodeFile) Mknod(name string, mode p9lib.FileMode, _, _ uint32, _ p9lib.UID, _ p9lib.GID) (p9lib.QID, error) {
	return qidAnswer(f.n.Mknod(name, uint32(mode)))
}

// qidAnswer is the reply to an operation that creates a name.
func qidAnswer(a hostfs.Attr, err error) (p9lib.QID, error) {
	if err != nil {
		return p9lib.QID{}, p9err(err)
	}
	return qidOf(a), nil
}

// Link implements p9.File.
func (f *nodeFile) Link(target p9lib.File, name string) error {
	return p9err(f.n.Link(nodeOf(target), name))
}

// Rename implements p9.File.
func (f *nodeFile) Rename(newDir p9lib.File, newName string) error {
	return p9err(f.n.Rename(nodeOf(newDir), newName))
}

// RenameAt implements p9.File.
func (f *nodeFile) RenameAt(oldName string, newDir p9lib.File, newName string) error {
	return p9err(f.n.RenameAt(oldName, nodeOf(newDir), newName))
}

// UnlinkAt implements p9.File.
func (f *nodeFile) UnlinkAt(name string, flags uint32) error {
	return p9err(f.n.UnlinkAt(name, flags))
}

// Renamed implements p9.File.
func (f *nodeFile) Renamed(newDir p9lib.File, newName string) {
	f.n.Renamed(nodeOf(newDir), newName)
}

// Readlink implements p9.File.
func (f *nodeFile) Readlink() (string, error) {
	target, err := f.n.Readlink()
	return target, p9err(err)
}

// Readdir implements p9.File.
func (f *nodeFile) Readdir(offset uint64, count uint32) (p9lib.Dirents, error) {
	ents, err := f.n.Readdir(offset, count)
	if err != nil {
		return nil, p9err(err)
	}
	out := make(p9lib.Dirents, len(ents))
	for i, d := range ents {
		typ := direntQIDType(d.Type)
		out[i] = p9lib.Dirent{QID: p9lib.QID{Type: typ, Path: d.Ino}, Offset: d.Offset, Type: typ, Name: d.Name}
	}
	return out, nil
}

// direntQIDType is the QID type of a hostfs.Dirent's type.
func direntQIDType(t uint8) p9lib.QIDType {
	switch t {
	case unix.DT_DIR:
		return p9lib.TypeDir
	case unix.DT_LNK:
		return p9lib.TypeSymlink
	}
	return p9lib.TypeRegular
}
