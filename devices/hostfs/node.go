package hostfs

import "golang.org/x/sys/unix"

// Node is one node of the export tree a file server holds for its client:
// the virtual attach root (Exports.Root), an export's root, or a file or
// directory walked to from there. Both servers map their requests onto it
// directly (virtio-fs's FUSE nodes and handles, virtio-9p's fids through
// a p9.File adapter). Errors are unix.Errno values, exactly the errno the
// guest gets. A Node may be used concurrently; Close ends it and must not
// run beside another call on the same Node.
type Node interface {
	// Walk returns a new, unopened Node for name, one path component of
	// this directory, and its attributes.
	Walk(name string) (Node, Attr, error)
	// Clone returns a new, unopened Node for the same host node.
	Clone() (Node, error)
	// Stat returns the node's key and host attributes.
	Stat() (Attr, error)
	// ChildKey returns the key of name, one component of this directory,
	// without opening it (no symlink followed), for a client that may
	// already hold that node: when the budget has no room for the
	// descriptor a Walk opens, a client that keeps one node per inode can
	// still answer a lookup of a name it holds (the guest revalidating
	// what it knows) from the node it has. The attach root's children
	// (export roots) are EINVAL: walk to them.
	ChildKey(name string) (Key, error)
	// StatFS describes the host file system holding the node.
	StatFS() (unix.Statfs_t, error)
	// SetAttr changes what attr.Valid names.
	SetAttr(attr SetAttr) error
	// Open opens the node itself with open(2) flags; at most once.
	Open(flags uint32) (Attr, error)
	// ReadvAt reads into the buffers of iov in order, from offset,
	// stopping at end of file; the node must be open.
	ReadvAt(iov [][]byte, offset int64) (int, error)
	// WritevAt writes the buffers of iov in order, at offset.
	WritevAt(iov [][]byte, offset int64) (int, error)
	// Readdir lists an open directory from offset (a position an earlier
	// entry gave, 0 for the start): the entries that fit count bytes at
	// 9P's size of an entry (direntSize).
	Readdir(offset uint64, count uint32) ([]Dirent, error)
	// Readlink returns a symlink's target.
	Readlink() (string, error)
	// Sync flushes an open file to stable storage (nothing if not open).
	Sync() error
	// Check fails with ESTALE once the node's export is withdrawn.
	Check() error
	// Close releases the node (and its open file).
	Close() error

	// Create creates name, a regular file, in this directory, opened with
	// open(2) flags, and returns it.
	Create(name string, flags, perm uint32) (Node, Attr, error)
	// Mkdir, Symlink and Mknod create name in this directory.
	Mkdir(name string, perm uint32) (Attr, error)
	Symlink(target, name string) (Attr, error)
	Mknod(name string, mode uint32) (Attr, error)
	// Link makes name in this directory a hard link to target.
	Link(target Node, name string) error
	// Rename moves this node to newName in newDir.
	Rename(newDir Node, newName string) error
	// RenameAt moves oldName of this directory to newName in newDir.
	RenameAt(oldName string, newDir Node, newName string) error
	// UnlinkAt removes name (a directory with unix.AT_REMOVEDIR).
	UnlinkAt(name string, flags uint32) error
	// Renamed tells the node its new place after a rename by its client.
	Renamed(newDir Node, newName string)

	// Extended attributes (see the package doc: none are offered).
	GetXattr(name string) ([]byte, error)
	ListXattrs() ([]string, error)
	SetXattr(name string, value []byte, flags int) error
	RemoveXattr(name string) error
}

// Attr is a node's identity and its host attributes.
type Attr struct {
	Key  Key
	Stat unix.Stat_t
}

// attrOf returns the attributes of a node of ex from its host stat, its
// owner as ex shows it.
func attrOf(ex *export, st *unix.Stat_t) Attr {
	a := Attr{Key: Key{Export: ex.serial, Dev: st.Dev, Ino: st.Ino}, Stat: *st}
	ex.showOwner(&a.Stat)
	return a
}

// devMix spreads a device number over the bits of an inode number.
const devMix = 0x9E3779B97F4A7C15

// GuestIno is the inode number the guest sees for a host node: the host
// inode mixed with its device, so that exports on different file systems
// rarely collide (9P's QID path, FUSE's inode number).
func GuestIno(dev, ino uint64) uint64 { return ino ^ (dev * devMix) }

// GuestIno is the inode number the guest sees for the node.
func (k Key) GuestIno() uint64 { return GuestIno(k.Dev, k.Ino) }

// Valid bits of a SetAttr.
const (
	SetMode uint32 = 1 << iota
	SetUID
	SetGID
	SetSize
	SetATime
	SetMTime
)

// SetAttr is a change of attributes: Valid says which fields apply.
// Times are utimensat(2)'s: unix.UTIME_NOW in Nsec is the current time
// (see SetTime).
type SetAttr struct {
	Valid        uint32
	Mode         uint32 // permission bits; set-id bits are dropped
	UID, GID     uint32
	Size         uint64
	ATime, MTime unix.Timespec
}

// SetTime is a SetAttr time: the current time, or sec and nsec (nsec
// taken modulo one second).
func SetTime(now bool, sec, nsec uint64) unix.Timespec {
	if now {
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	}
	return unix.Timespec{Sec: int64(sec), Nsec: int64(nsec % 1e9)}
}

// Dirent is one directory entry.
type Dirent struct {
	Ino    uint64 // as GuestIno
	Offset uint64 // the position after this entry, for the next Readdir
	Type   uint8  // unix.DT_DIR, unix.DT_LNK, or unix.DT_REG for the rest
	Name   string
}
