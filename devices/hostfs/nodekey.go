package hostfs

import "golang.org/x/sys/unix"

// Key identifies the host node a Node stands for, for clients that keep
// one node per inode (the virtio-fs device's FUSE server, whose guest
// kernel expects one node id per inode): two Nodes of one export on the
// same host inode have equal keys, and Nodes of different exports never
// do, even on the same host inode, so a node reached through a read-only
// export is never confused with the same inode reached through a
// read-write one. The attach root has Export 0.
type Key struct {
	Export   uint64
	Dev, Ino uint64
}

// rootIno is the attach root's inode number (never a host inode's mixed
// number in practice: the top bit pattern is reserved here).
const rootIno = 0xFFFF_FFFF_FFFF_FF01

// RootKey is the attach root's key.
var RootKey = Key{Ino: rootIno}

// ChildKey implements Node: the name is one checked component, stat'ed
// beneath f's descriptor without following a symlink.
func (f *file) ChildKey(name string) (Key, error) {
	if err := checkName(name); err != nil {
		return Key{}, err
	}
	if err := f.ex.enter(); err != nil {
		return Key{}, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.isDir() {
		return Key{}, unix.ENOTDIR
	}
	if f.isViewRoot() {
		if name != f.ex.viewName {
			return Key{}, unix.ENOENT
		}
		if f.ex.pinned {
			var st unix.Stat_t
			if err := unix.Fstat(f.ex.pinFd, &st); err != nil {
				return Key{}, err
			}
			return Key{Export: f.ex.serial, Dev: st.Dev, Ino: st.Ino}, nil
		}
		name = f.ex.fileName
	}
	var st unix.Stat_t
	if err := unix.Fstatat(f.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Key{}, err
	}
	return Key{Export: f.ex.serial, Dev: st.Dev, Ino: st.Ino}, nil
}
