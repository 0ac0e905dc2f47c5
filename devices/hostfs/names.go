package hostfs

import (
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
)

// Operations that create, remove or rename names in a directory. Each
// starts with beginNames (the export still there, writable, not a
// single-file export, every name one component) and works through the
// *at system calls relative to the directory's descriptor, which never
// follow a final symlink.

// maxNameLen is the longest path component Linux accepts.
const maxNameLen = 255

// checkName refuses anything but one ordinary path component.
func checkName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
		return unix.EINVAL
	case len(name) > maxNameLen:
		return unix.ENAMETOOLONG
	case strings.ContainsAny(name, "/\x00"):
		return unix.EINVAL
	}
	return nil
}

// Create implements Node.
func (f *file) Create(name string, flags, perm uint32) (Node, Attr, error) {
	if err := f.beginNames(name); err != nil {
		return nil, Attr{}, err
	}
	defer f.ex.exit()
	if err := f.ex.acquire(2); err != nil { // the open file and its O_PATH
		return nil, Attr{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	nf, st, err := f.createLocked(name, flags, perm)
	if err != nil {
		f.ex.release(2)
		return nil, Attr{}, err
	}
	return nf, attrOf(f.ex, st), nil
}

// createLocked creates name open with flags and returns its file, holding
// both descriptors (acquired by the caller). f.mu is held.
func (f *file) createLocked(name string, flags, perm uint32) (*file, *unix.Stat_t, error) {
	osFlags := int(flags&unix.O_ACCMODE | flags&passOpenFlags)
	mode := perm & 0o7777 &^ privBits
	openFd, err := beneath.OpenAt(f.fd, name, unix.OpenHow{
		Flags: uint64(osFlags | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW),
		Mode:  uint64(mode),
	})
	if err != nil {
		return nil, nil, err
	}
	pathFd, err := unix.Open(procPath(openFd), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Close(openFd)
		return nil, nil, err
	}
	st, err := fstat(pathFd)
	if err == nil {
		nf := newFile(f.ex, pathFd, f, name, st.Mode, openFd)
		nf.dev = st.Dev
		return nf, st, nil
	}
	_ = unix.Close(pathFd)
	_ = unix.Close(openFd)
	return nil, nil, err
}

// statChild returns the attributes of name in this directory, without
// following it.
func (f *file) statChild(name string) (Attr, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(f.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Attr{}, err
	}
	return attrOf(f.ex, &st), nil
}

// Mkdir implements Node.
// Set-user-ID and set-group-ID bits are dropped from the mode (a
// directory's set-group-ID bit only makes new entries inherit its group,
// but the guest has no say in host groups; the host may still set it when
// the parent directory has it).
func (f *file) Mkdir(name string, perm uint32) (Attr, error) {
	if err := f.beginNames(name); err != nil {
		return Attr{}, err
	}
	defer f.ex.exit()
	if err := unix.Mkdirat(f.fd, name, perm&0o7777&^privBits); err != nil {
		return Attr{}, err
	}
	return f.statChild(name)
}

// Symlink implements Node. The target is stored as given: it is only
// ever resolved by the guest, in the guest.
func (f *file) Symlink(target, name string) (Attr, error) {
	if err := f.beginNames(name); err != nil {
		return Attr{}, err
	}
	defer f.ex.exit()
	if target == "" || len(target) >= unix.PathMax {
		return Attr{}, unix.EINVAL
	}
	if err := unix.Symlinkat(target, f.fd, name); err != nil {
		return Attr{}, err
	}
	return f.statChild(name)
}

// Link implements Node (a hard link to target, in this directory).
func (f *file) Link(target Node, name string) error {
	if err := f.beginNames(name); err != nil {
		return err
	}
	defer f.ex.exit()
	t, err := f.sameExport(target)
	if err != nil {
		return err
	}
	tfd, tmode := t.fd, t.mode
	if tmode&unix.S_IFMT == unix.S_IFDIR || tmode&unix.S_IFMT == unix.S_IFLNK {
		return unix.EPERM
	}
	// linkat with AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the /proc link
	// of our own descriptor names the same inode without it.
	return unix.Linkat(unix.AT_FDCWD, procPath(tfd), f.fd, name, unix.AT_SYMLINK_FOLLOW)
}

// Mknod implements Node: regular files, FIFOs and sockets only (the
// type bits of mode). Set-user-ID and set-group-ID bits are dropped.
func (f *file) Mknod(name string, mode uint32) (Attr, error) {
	if err := f.beginNames(name); err != nil {
		return Attr{}, err
	}
	defer f.ex.exit()
	typ := mode & unix.S_IFMT
	switch typ {
	case 0, unix.S_IFREG, unix.S_IFIFO, unix.S_IFSOCK:
	default:
		return Attr{}, unix.EPERM
	}
	if err := unix.Mknodat(f.fd, name, typ|mode&0o7777&^privBits, 0); err != nil {
		return Attr{}, err
	}
	return f.statChild(name)
}

// Rename implements Node.
func (f *file) Rename(newDir Node, newName string) error {
	if err := f.beginNames(newName); err != nil {
		return err
	}
	defer f.ex.exit()
	nd, err := f.sameExport(newDir)
	if err != nil {
		return err
	}
	parent, name := f.parentAndName()
	if parent == nil {
		return unix.EBUSY // the export root itself
	}
	return unix.Renameat(parent.fd, name, nd.fd, newName)
}

// RenameAt implements Node.
func (f *file) RenameAt(oldName string, newDir Node, newName string) error {
	if err := f.beginNames(oldName, newName); err != nil {
		return err
	}
	defer f.ex.exit()
	nd, err := f.sameExport(newDir)
	if err != nil {
		return err
	}
	return unix.Renameat(f.fd, oldName, nd.fd, newName)
}

// UnlinkAt implements Node.
func (f *file) UnlinkAt(name string, flags uint32) error {
	if err := f.beginNames(name); err != nil {
		return err
	}
	defer f.ex.exit()
	return unix.Unlinkat(f.fd, name, int(flags)&unix.AT_REMOVEDIR)
}
