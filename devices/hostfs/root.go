package hostfs

import (
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
)

// rootQIDPath identifies the virtual attach root (never a host inode's
// mixed path in practice: the top bit pattern is reserved here).
const rootQIDPath = 0xFFFF_FFFF_FFFF_FF01

// rootFile is the virtual attach root: a read-only directory whose only
// children are the export names. It cannot be listed, so a guest learns no
// export names it was not given.
type rootFile struct {
	p9.DefaultWalkGetAttr
	exports *Exports
}

var _ p9.File = (*rootFile)(nil)

func (r *rootFile) qid() p9.QID { return p9.QID{Type: p9.TypeDir, Path: rootQIDPath} }

// Walk implements p9.File: nothing (a clone) or one export name.
func (r *rootFile) Walk(names []string) ([]p9.QID, p9.File, error) {
	switch len(names) {
	case 0:
		return nil, &rootFile{exports: r.exports}, nil
	case 1:
	default:
		return nil, nil, linux.EINVAL
	}
	if err := checkName(names[0]); err != nil {
		return nil, nil, err
	}
	ex, ok := r.exports.lookup(names[0])
	if !ok {
		return nil, nil, linux.ENOENT
	}
	if ex.enter() != nil {
		return nil, nil, linux.ENOENT // withdrawn since the lookup
	}
	defer ex.exit()
	f, st, err := newRootFile(ex)
	if err != nil {
		return nil, nil, err
	}
	return []p9.QID{qidFor(st)}, f, nil
}

// GetAttr implements p9.File.
func (r *rootFile) GetAttr(p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	return r.qid(), p9.AttrMask{Mode: true, NLink: true, Size: true},
		p9.Attr{Mode: p9.ModeDirectory | 0o555, NLink: 2}, nil
}

// Open implements p9.File: read-only.
func (r *rootFile) Open(flags p9.OpenFlags) (p9.QID, uint32, error) {
	if flags.Mode() != p9.ReadOnly {
		return p9.QID{}, 0, linux.EROFS
	}
	return r.qid(), 0, nil
}

// Readdir implements p9.File: always empty.
func (r *rootFile) Readdir(uint64, uint32) (p9.Dirents, error) { return nil, nil }

// StatFS implements p9.File.
func (r *rootFile) StatFS() (p9.FSStat, error) {
	return p9.FSStat{BlockSize: 4096, NameLength: maxNameLen}, nil
}

// Close implements p9.File.
func (r *rootFile) Close() error { return nil }

// FSync implements p9.File.
func (r *rootFile) FSync() error { return nil }

// Lock implements p9.File.
func (r *rootFile) Lock(int, p9.LockType, p9.LockFlags, uint64, uint64, string) (p9.LockStatus, error) {
	return p9.LockStatusOK, nil
}

// Readlink implements p9.File.
func (r *rootFile) Readlink() (string, error) { return "", linux.EINVAL }

// GetXattr implements p9.File.
func (r *rootFile) GetXattr(string) ([]byte, error) { return nil, linux.ENODATA }

// ListXattrs implements p9.File.
func (r *rootFile) ListXattrs() ([]string, error) { return nil, nil }

// Renamed implements p9.File.
func (r *rootFile) Renamed(p9.File, string) {}

// Every mutation of the virtual root is refused.

func (r *rootFile) SetAttr(p9.SetAttrMask, p9.SetAttr) error     { return linux.EROFS }
func (r *rootFile) ReadAt([]byte, int64) (int, error)            { return 0, linux.EISDIR }
func (r *rootFile) WriteAt([]byte, int64) (int, error)           { return 0, linux.EROFS }
func (r *rootFile) SetXattr(string, []byte, p9.XattrFlags) error { return linux.EROFS }
func (r *rootFile) RemoveXattr(string) error                     { return linux.EROFS }
func (r *rootFile) Link(p9.File, string) error                   { return linux.EROFS }
func (r *rootFile) Rename(p9.File, string) error                 { return linux.EROFS }
func (r *rootFile) RenameAt(string, p9.File, string) error       { return linux.EROFS }
func (r *rootFile) UnlinkAt(string, uint32) error                { return linux.EROFS }
func (r *rootFile) Mkdir(string, p9.FileMode, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, linux.EROFS
}
func (r *rootFile) Symlink(string, string, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, linux.EROFS
}
func (r *rootFile) Mknod(string, p9.FileMode, uint32, uint32, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, linux.EROFS
}
func (r *rootFile) Create(string, p9.OpenFlags, p9.FileMode, p9.UID, p9.GID) (p9.File, p9.QID, uint32, error) {
	return nil, p9.QID{}, 0, linux.EROFS
}
