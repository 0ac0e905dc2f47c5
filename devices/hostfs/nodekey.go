package hostfs

import (
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// NodeKey identifies the host node a File of this package stands for, for
// clients that keep one node per inode (the virtio-fs device's FUSE server,
// whose guest kernel expects one node id per inode): two Files of one
// export on the same host inode have equal keys, and Files of different
// exports never do, even on the same host inode, so a node reached through
// a read-only export is never confused with the same inode reached
// through a read-write one. The attach root has Export 0.
type NodeKey struct {
	Export   uint64
	Dev, Ino uint64
}

// rootNodeKey is the attach root's key.
var rootNodeKey = NodeKey{Ino: rootQIDPath}

// Identify returns f's key and its attributes (as GetAttr would), from one
// host stat. f must come from Exports.Attach or a walk from it; another
// File is EINVAL.
func Identify(f p9.File) (NodeKey, p9.QID, p9.Attr, error) {
	switch f := f.(type) {
	case *rootFile:
		qid, _, attr, err := f.GetAttr(p9.AttrMaskAll)
		return rootNodeKey, qid, attr, err
	case *file:
		return f.identify()
	}
	return NodeKey{}, p9.QID{}, p9.Attr{}, linux.EINVAL
}

func (f *file) identify() (NodeKey, p9.QID, p9.Attr, error) {
	if err := f.ex.enter(); err != nil {
		return NodeKey{}, p9.QID{}, p9.Attr{}, err
	}
	defer f.ex.exit()
	st, err := f.stat()
	if err != nil {
		return NodeKey{}, p9.QID{}, p9.Attr{}, err
	}
	_, attr := attrFor(st, p9.AttrMaskAll)
	return NodeKey{Export: f.ex.serial, Dev: st.Dev, Ino: st.Ino}, qidFor(st), attr, nil
}

// ChildKey returns the key of name in the directory dir (a File of this
// package) without opening it, for a client that may already hold that
// node: when the budget has no room for the descriptor a walk opens, a
// client that keeps one node per inode can still answer a lookup of a
// name it holds (the guest revalidating what it knows) from the node it
// has. The name is one checked component, stat'ed beneath dir's
// descriptor without following a symlink. The attach root's children
// (export roots) are EINVAL: walk to them.
func ChildKey(dir p9.File, name string) (NodeKey, error) {
	f, ok := dir.(*file)
	if !ok {
		return NodeKey{}, linux.EINVAL
	}
	if err := checkName(name); err != nil {
		return NodeKey{}, err
	}
	if err := f.ex.enter(); err != nil {
		return NodeKey{}, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.isDir() {
		return NodeKey{}, linux.ENOTDIR
	}
	if f.isViewRoot() {
		if name != f.ex.viewName {
			return NodeKey{}, linux.ENOENT
		}
		name = f.ex.fileName
	}
	var st unix.Stat_t
	if err := unix.Fstatat(f.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return NodeKey{}, errno(err)
	}
	return NodeKey{Export: f.ex.serial, Dev: st.Dev, Ino: st.Ino}, nil
}
