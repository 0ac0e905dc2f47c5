package hostfs

import (
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
)

// Linux open(2) flags the guest may pass through to a host open besides the
// access mode.
const passOpenFlags = unix.O_TRUNC | unix.O_APPEND | unix.O_SYNC | unix.O_DSYNC

// privBits are the set-user-ID and set-group-ID bits: the guest never sets
// them on the host (see the package doc).
const privBits = unix.S_ISUID | unix.S_ISGID

// file is one node of an export, held by an O_PATH descriptor. A
// server may call its methods concurrently (reads and writes on one open
// file, for example); mu guards the mutable fields. Every method that
// uses a descriptor runs between f.ex.enter and f.ex.exit, so a withdrawn
// export's files fail with ESTALE and revoke never closes a descriptor an
// operation is using.
type file struct {
	ex *export

	// refs counts Close-pending owners: the client's own reference
	// plus one per child whose parent this is. Descriptors are closed at 0:
	// a directory the client closed keeps its descriptor while
	// a child holds it (Rename and a symlink's times need it), and that
	// descriptor stays counted in the export's budget until then.
	refs atomic.Int32

	mu     sync.Mutex
	fd     int    // O_PATH|O_NOFOLLOW descriptor of this node; -1 once closed
	parent *file  // the directory holding this node; nil for the export root
	name   string // name within parent ("" for the export root)
	mode   uint32 // st_mode at walk time (type bits are stable)
	openFd int    // real descriptor after Open/Create; -1 before
	dev    uint64 // st_dev of an open directory (its entries' inode numbers)
}

// newFile returns a file with one reference, taking a reference on parent;
// the export tracks it until its descriptors are closed. fd and openFd
// (when open) were acquired from the export's budget. Called between
// ex.enter and ex.exit.
func newFile(ex *export, fd int, parent *file, name string, mode uint32, openFd int) *file {
	f := &file{ex: ex, fd: fd, parent: parent, name: name, mode: mode, openFd: openFd}
	f.refs.Store(1)
	if parent != nil {
		parent.refs.Add(1)
	}
	ex.track(f)
	return f
}

// unref drops one reference; the last one closes the descriptors.
func (f *file) unref() {
	if f.refs.Add(-1) != 0 {
		return
	}
	f.closeDescriptors()
	f.ex.forget(f)
	f.mu.Lock()
	parent := f.parent
	f.parent = nil
	f.mu.Unlock()
	if parent != nil {
		parent.unref()
	}
}

// closeDescriptors closes whatever host descriptors f still holds (at its
// last reference, or when its export is revoked) and gives them back to
// the budget.
func (f *file) closeDescriptors() {
	f.mu.Lock()
	defer f.mu.Unlock()
	closed := 0
	for _, fd := range []*int{&f.openFd, &f.fd} {
		if *fd >= 0 {
			_ = unix.Close(*fd)
			*fd = -1
			closed++
		}
	}
	f.ex.release(closed)
}

// closeOpen closes the descriptor of an open file, if any, and gives it
// back to the budget; f.mu is held.
func (f *file) closeOpen() {
	if f.openFd >= 0 {
		_ = unix.Close(f.openFd)
		f.openFd = -1
		f.ex.release(1)
	}
}

// parentAndName returns the current parent and name under f.mu.
func (f *file) parentAndName() (*file, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.parent, f.name
}

var _ Node = (*file)(nil)

// newRootFile returns a File for the export's root directory (the view
// directory of a single-file export) and its attributes. Called between
// ex.enter and ex.exit.
func newRootFile(ex *export) (*file, *unix.Stat_t, error) {
	if err := ex.acquire(1); err != nil {
		return nil, nil, err
	}
	fd, err := beneath.OpenAt(ex.rootFd, ".", unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY})
	if err != nil {
		ex.release(1)
		return nil, nil, err
	}
	st, err := fstat(fd)
	if err != nil {
		_ = unix.Close(fd)
		ex.release(1)
		return nil, nil, err
	}
	return newFile(ex, fd, nil, "", st.Mode, -1), st, nil
}

// openBeneath opens one name in dirFd as an O_PATH descriptor, never
// following a symlink and never leaving dirFd (beneath.OpenAt, the one
// confined open; the name is checked first, so the guest's bad names get
// this package's errnos).
func openBeneath(dirFd int, name string) (int, error) {
	if err := checkName(name); err != nil {
		return -1, err
	}
	return beneath.OpenAt(dirFd, name, unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW})
}

// openRegularBeneath is openBeneath for a name that must be a regular file
// (ENOENT otherwise); it returns the descriptor and its attributes.
func openRegularBeneath(dirFd int, name string) (int, *unix.Stat_t, error) {
	fd, err := openBeneath(dirFd, name)
	if err != nil {
		return -1, nil, err
	}
	st, err := fstat(fd)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		err = unix.ENOENT
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, nil, err
	}
	return fd, st, nil
}

func fstat(fd int) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "", &st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, err
	}
	return &st, nil
}

// procPath names exactly the inode behind one of our own descriptors.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func dupFd(fd int) (int, error) {
	n, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	return n, err
}

func (f *file) isSymlink() bool { return f.mode&unix.S_IFMT == unix.S_IFLNK }
func (f *file) isDir() bool     { return f.mode&unix.S_IFMT == unix.S_IFDIR }

// sameExport returns other as a *file of f's export, or EXDEV.
func (f *file) sameExport(other Node) (*file, error) {
	o, ok := other.(*file)
	if !ok || o.ex != f.ex {
		return nil, unix.EXDEV
	}
	return o, nil
}

// beginMutation starts an operation that changes f or its contents: it
// enters the export (ESTALE once withdrawn) and refuses a read-only one
// (EROFS). On success the caller ends the operation with f.ex.exit.
func (f *file) beginMutation() error {
	if err := f.ex.enter(); err != nil {
		return err
	}
	if f.ex.readOnly {
		f.ex.exit()
		return unix.EROFS
	}
	return nil
}

// beginNames starts an operation that creates, removes or renames names
// in f: beginMutation, then EPERM in a single-file export (its one name
// is fixed), then each of names checked as one path component. On
// success the caller ends the operation with f.ex.exit.
func (f *file) beginNames(names ...string) error {
	if err := f.beginMutation(); err != nil {
		return err
	}
	err := error(nil)
	if f.ex.isFileView() {
		err = unix.EPERM
	}
	for _, name := range names {
		if err == nil {
			err = checkName(name)
		}
	}
	if err != nil {
		f.ex.exit()
	}
	return err
}

// isViewRoot says whether f is the directory of a single-file export.
func (f *file) isViewRoot() bool { return f.ex.isFileView() && f.parent == nil }

// refresh finds a single-file export's file again by its name (see
// Exports.AddFile) for a Node that is not open; when the name no longer
// names a regular file, f keeps the one it had. An immutable export's
// file never changes (AddImmutableFile). Called with f.mu held, between
// enter and exit.
func (f *file) refresh() {
	if !f.ex.isFileView() || f.ex.pinned || f.parent == nil || f.openFd >= 0 {
		return
	}
	fd, st, err := openRegularBeneath(f.ex.rootFd, f.ex.fileName)
	if err != nil {
		return
	}
	_ = unix.Close(f.fd)
	f.fd, f.mode = fd, st.Mode
}

// Walk implements Node.
func (f *file) Walk(name string) (Node, Attr, error) {
	if err := f.ex.enter(); err != nil {
		return nil, Attr{}, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.isDir() {
		return nil, Attr{}, unix.ENOTDIR
	}
	if err := f.ex.acquire(1); err != nil {
		return nil, Attr{}, err
	}
	nf, st, err := f.walkLocked(name)
	if err != nil {
		f.ex.release(1)
		return nil, Attr{}, err
	}
	return nf, attrOf(f.ex, st), nil
}

// Clone implements Node.
func (f *file) Clone() (Node, error) {
	if err := f.ex.enter(); err != nil {
		return nil, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.ex.acquire(1); err != nil {
		return nil, err
	}
	fd, err := dupFd(f.fd)
	if err != nil {
		f.ex.release(1)
		return nil, err
	}
	return newFile(f.ex, fd, f.parent, f.name, f.mode, -1), nil
}

// walkLocked opens the descriptor of Walk's new file (one, acquired by
// the caller), f's child name. f.mu is held.
func (f *file) walkLocked(name string) (*file, *unix.Stat_t, error) {
	if f.isViewRoot() {
		return f.walkView(name)
	}
	fd, err := openBeneath(f.fd, name)
	if err != nil {
		return nil, nil, err
	}
	st, err := fstat(fd)
	if err != nil {
		_ = unix.Close(fd)
		return nil, nil, err
	}
	return newFile(f.ex, fd, f, name, st.Mode, -1), st, nil
}

// walkView walks from a single-file export's directory to its one name.
func (f *file) walkView(name string) (*file, *unix.Stat_t, error) {
	if err := checkName(name); err != nil {
		return nil, nil, err
	}
	if name != f.ex.viewName {
		return nil, nil, unix.ENOENT
	}
	fd, st, err := f.ex.viewFile(f.fd)
	if err != nil {
		return nil, nil, err
	}
	return newFile(f.ex, fd, f, f.ex.fileName, st.Mode, -1), st, nil
}

// StatFS implements Node.
func (f *file) StatFS() (unix.Statfs_t, error) {
	var st unix.Statfs_t
	if err := f.ex.enter(); err != nil {
		return st, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	err := unix.Fstatfs(f.fd, &st)
	return st, err
}

// Stat implements Node.
func (f *file) Stat() (Attr, error) {
	if err := f.ex.enter(); err != nil {
		return Attr{}, err
	}
	defer f.ex.exit()
	st, err := f.stat()
	if err != nil {
		return Attr{}, err
	}
	return attrOf(f.ex, st), nil
}

// stat returns the node's host attributes (a single-file export's file
// found again first). Called between enter and exit.
func (f *file) stat() (*unix.Stat_t, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refresh()
	return fstat(f.fd)
}

// SetAttr implements Node. Set-user-ID and set-group-ID bits are
// dropped from a new mode, and cleared before a truncation (killPriv); an
// owner other than the helper's own (or the one the export shows for it)
// is refused (ownersStayOurs).
func (f *file) SetAttr(attr SetAttr) error {
	if err := f.beginMutation(); err != nil {
		return err
	}
	defer f.ex.exit()
	if f.isViewRoot() {
		return unix.EPERM // the host directory around the one file
	}
	attr = f.ex.hostOwner(attr)
	if err := ownersStayOurs(attr); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refresh()
	valid := attr.Valid
	if f.isSymlink() {
		// Only times make sense on a link itself; do them by name with
		// AT_SYMLINK_NOFOLLOW (never through the link).
		if valid&(SetMode|SetSize|SetUID|SetGID) != 0 {
			return unix.EOPNOTSUPP
		}
		if valid&(SetATime|SetMTime) != 0 && f.parent != nil {
			return unix.UtimesNanoAt(f.parent.fd, f.name, setTimes(attr), unix.AT_SYMLINK_NOFOLLOW)
		}
		return nil
	}
	if valid&SetMode != 0 {
		if err := unix.Chmod(procPath(f.fd), attr.Mode&0o7777&^privBits); err != nil {
			return err
		}
	}
	if valid&(SetUID|SetGID) != 0 {
		if err := f.chown(attr); err != nil {
			return err
		}
	}
	if valid&SetSize != 0 {
		if err := f.truncate(attr.Size); err != nil {
			return err
		}
	}
	if valid&(SetATime|SetMTime) != 0 {
		return unix.UtimesNanoAt(unix.AT_FDCWD, procPath(f.fd), setTimes(attr), 0)
	}
	return nil
}

// chown gives the node the uid or gid attr sets; f.mu is held.
func (f *file) chown(attr SetAttr) error {
	uid, gid := -1, -1
	if attr.Valid&SetUID != 0 {
		uid = int(attr.UID)
	}
	if attr.Valid&SetGID != 0 {
		gid = int(attr.GID)
	}
	return unix.Fchownat(f.fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
}

// truncate sets the file's size, its set-id bits cleared first; f.mu is
// held.
func (f *file) truncate(size uint64) error {
	if size > 1<<62 {
		return unix.EFBIG
	}
	if err := killPriv(f.fd); err != nil {
		return err
	}
	return unix.Truncate(procPath(f.fd), int64(size))
}

// ownersStayOurs refuses (EPERM) a change of owner to any uid or gid
// but the helper's own effective ones, before anything reaches the host:
// a helper run as root could otherwise chown, and give a guest's file in
// a writable export to any user of the host. Our own uid or gid (or
// none) goes to the host as asked.
func ownersStayOurs(attr SetAttr) error {
	if attr.Valid&SetUID != 0 && attr.UID != uint32(unix.Geteuid()) {
		return unix.EPERM
	}
	if attr.Valid&SetGID != 0 && attr.GID != uint32(unix.Getegid()) {
		return unix.EPERM
	}
	return nil
}

// setTimes builds utimensat's times: those attr sets, the others left
// alone.
func setTimes(attr SetAttr) []unix.Timespec {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	if attr.Valid&SetATime != 0 {
		ts[0] = attr.ATime
	}
	if attr.Valid&SetMTime != 0 {
		ts[1] = attr.MTime
	}
	return ts
}

// Close implements Node: the client's reference goes; the descriptors
// stay while children still use this directory.
func (f *file) Close() error {
	f.mu.Lock()
	f.closeOpen()
	f.mu.Unlock()
	f.unref()
	return nil
}

// Open implements Node. Only regular files and directories are opened on
// the host (a FIFO or device node would block or reach host devices).
func (f *file) Open(flags uint32) (Attr, error) {
	if err := f.ex.enter(); err != nil {
		return Attr{}, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refresh()
	if f.openFd >= 0 {
		return Attr{}, unix.EINVAL
	}
	mode := flags & unix.O_ACCMODE
	writes := mode == unix.O_WRONLY || mode == unix.O_RDWR || flags&unix.O_TRUNC != 0
	if writes && f.ex.readOnly {
		return Attr{}, unix.EROFS
	}
	var osFlags int
	switch f.mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if mode != unix.O_RDONLY {
			return Attr{}, unix.EISDIR
		}
		osFlags = unix.O_RDONLY | unix.O_DIRECTORY
	case unix.S_IFREG:
		osFlags = int(mode | flags&passOpenFlags)
	default:
		return Attr{}, unix.EPERM
	}
	if err := f.ex.acquire(1); err != nil {
		return Attr{}, err
	}
	st, err := f.openLocked(osFlags)
	if err != nil {
		f.ex.release(1)
		return Attr{}, err
	}
	return attrOf(f.ex, st), nil
}

// openLocked opens the node with osFlags as its open descriptor (acquired
// by the caller); f.mu is held.
func (f *file) openLocked(osFlags int) (*unix.Stat_t, error) {
	fd, err := unix.Open(procPath(f.fd), osFlags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	st, err := fstat(fd)
	if err == nil && osFlags&unix.O_TRUNC != 0 {
		err = killPriv(fd)
	}
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	f.openFd = fd
	f.dev = st.Dev
	return st, nil
}

// openDescriptor returns the descriptor of an open file. The caller is
// between enter and exit, so the descriptor stays open while it uses it:
// only revoke (excluded by enter) and the last Close (which the server
// never runs beside another operation on the Node) close it.
func (f *file) openDescriptor() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.openFd < 0 {
		return -1, unix.EBADF
	}
	return f.openFd, nil
}

// killPriv clears, before the file behind fd is written or truncated, its
// set-user-ID bit and (when it is group-executable) its set-group-ID bit,
// as Linux does for a writer without CAP_FSETID — virtiofsd's killpriv_v2
// relies on the same rule. The helper may hold CAP_FSETID; the guest must
// still not leave a privileged program modified on the host.
func killPriv(fd int) error {
	st, err := fstat(fd)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	kill := st.Mode & unix.S_ISUID
	if st.Mode&(unix.S_ISGID|unix.S_IXGRP) == unix.S_ISGID|unix.S_IXGRP {
		kill |= unix.S_ISGID
	}
	if kill == 0 {
		return nil
	}
	return unix.Chmod(procPath(fd), st.Mode&0o7777&^kill)
}

// SetXattr implements Node: not supported.
func (f *file) SetXattr(string, []byte, int) error {
	if err := f.beginMutation(); err != nil {
		return err
	}
	f.ex.exit()
	return unix.EOPNOTSUPP
}

// GetXattr implements Node: no attribute exists.
func (f *file) GetXattr(string) ([]byte, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	return nil, unix.ENODATA
}

// ListXattrs implements Node: none.
func (f *file) ListXattrs() ([]string, error) { return nil, f.Check() }

// RemoveXattr implements Node: not supported.
func (f *file) RemoveXattr(string) error {
	if err := f.beginMutation(); err != nil {
		return err
	}
	f.ex.exit()
	return unix.EOPNOTSUPP
}

// Sync implements Node.
func (f *file) Sync() error {
	if err := f.ex.enter(); err != nil {
		return err
	}
	defer f.ex.exit()
	fd, err := f.openDescriptor()
	if err != nil {
		return nil // nothing written through this node
	}
	return unix.Fsync(fd)
}

// Check implements Node (9P's Tlock: local-only semantics, see the
// package doc).
func (f *file) Check() error {
	if err := f.ex.enter(); err != nil {
		return err
	}
	f.ex.exit()
	return nil
}

// Readlink implements Node.
func (f *file) Readlink() (string, error) {
	if err := f.ex.enter(); err != nil {
		return "", err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.isSymlink() {
		return "", unix.EINVAL
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(f.fd, "", buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// Renamed implements Node: the client tells us our new parent and name.
func (f *file) Renamed(newDir Node, newName string) {
	nd, ok := newDir.(*file)
	if !ok || nd.ex != f.ex {
		return
	}
	nd.refs.Add(1)
	f.mu.Lock()
	old := f.parent
	f.parent = nd
	f.name = newName
	f.mu.Unlock()
	if old != nil {
		old.unref()
	}
}
