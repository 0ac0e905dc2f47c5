package hostfs

import "golang.org/x/sys/unix"

// rootFile is the virtual attach root: a read-only directory whose only
// children are the export names. It cannot be listed, so a guest learns no
// export names it was not given.
type rootFile struct {
	exports *Exports
}

var _ Node = (*rootFile)(nil)

// Root returns the virtual attach root, a Node of its own: a read-only,
// unlistable directory whose children are the export names.
func (x *Exports) Root() Node { return &rootFile{exports: x} }

// Walk implements Node: one export name.
func (r *rootFile) Walk(name string) (Node, Attr, error) {
	if err := checkName(name); err != nil {
		return nil, Attr{}, err
	}
	ex, ok := r.exports.lookup(name)
	if !ok {
		return nil, Attr{}, unix.ENOENT
	}
	if ex.enter() != nil {
		return nil, Attr{}, unix.ENOENT // withdrawn since the lookup
	}
	defer ex.exit()
	f, st, err := newRootFile(ex)
	if err != nil {
		return nil, Attr{}, err
	}
	return f, attrOf(ex, st), nil
}

// Clone implements Node.
func (r *rootFile) Clone() (Node, error) { return &rootFile{exports: r.exports}, nil }

// Stat implements Node.
func (r *rootFile) Stat() (Attr, error) {
	return Attr{Key: RootKey, Stat: unix.Stat_t{Mode: unix.S_IFDIR | 0o555, Nlink: 2}}, nil
}

// ChildKey implements Node: export roots are walked to, never keyed.
func (r *rootFile) ChildKey(string) (Key, error) { return Key{}, unix.EINVAL }

// Open implements Node: read-only.
func (r *rootFile) Open(flags uint32) (Attr, error) {
	if flags&unix.O_ACCMODE != unix.O_RDONLY {
		return Attr{}, unix.EROFS
	}
	return r.Stat()
}

// Readdir implements Node: always empty.
func (r *rootFile) Readdir(uint64, uint32) ([]Dirent, error) { return nil, nil }

// StatFS implements Node.
func (r *rootFile) StatFS() (unix.Statfs_t, error) {
	return unix.Statfs_t{Bsize: 4096, Namelen: maxNameLen}, nil
}

// The root holds nothing, is never withdrawn and has no attributes.

func (r *rootFile) Close() error                         { return nil }
func (r *rootFile) Sync() error                          { return nil }
func (r *rootFile) Check() error                         { return nil }
func (r *rootFile) Readlink() (string, error)            { return "", unix.EINVAL }
func (r *rootFile) GetXattr(string) ([]byte, error)      { return nil, unix.ENODATA }
func (r *rootFile) ListXattrs() ([]string, error)        { return nil, nil }
func (r *rootFile) Renamed(Node, string)                 {}
func (r *rootFile) ReadvAt([][]byte, int64) (int, error) { return 0, unix.EISDIR }

// Every mutation of the virtual root is refused.

func (r *rootFile) SetAttr(SetAttr) error                 { return unix.EROFS }
func (r *rootFile) WritevAt([][]byte, int64) (int, error) { return 0, unix.EROFS }
func (r *rootFile) SetXattr(string, []byte, int) error    { return unix.EROFS }
func (r *rootFile) RemoveXattr(string) error              { return unix.EROFS }
func (r *rootFile) Link(Node, string) error               { return unix.EROFS }
func (r *rootFile) Rename(Node, string) error             { return unix.EROFS }
func (r *rootFile) RenameAt(string, Node, string) error   { return unix.EROFS }
func (r *rootFile) UnlinkAt(string, uint32) error         { return unix.EROFS }
func (r *rootFile) Mkdir(string, uint32) (Attr, error)    { return Attr{}, unix.EROFS }
func (r *rootFile) Symlink(string, string) (Attr, error)  { return Attr{}, unix.EROFS }
func (r *rootFile) Mknod(string, uint32) (Attr, error)    { return Attr{}, unix.EROFS }
func (r *rootFile) Create(string, uint32, uint32) (Node, Attr, error) {
	return nil, Attr{}, unix.EROFS
}
