package hostfs

import (
	"errors"
	"io"
	"math"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// resolveFlags confine every name lookup beneath the directory descriptor
// it starts from (names are single components, so RESOLVE_NO_SYMLINKS only
// matters as belt and braces; the final component is never followed).
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_SYMLINKS

// Linux open(2) flags the guest may pass through to a host open besides the
// access mode (9P2000.L uses the Linux values).
const passOpenFlags = unix.O_TRUNC | unix.O_APPEND | unix.O_SYNC | unix.O_DSYNC

// privBits are the set-user-ID and set-group-ID bits: the guest never sets
// them on the host (see the package doc).
const privBits = unix.S_ISUID | unix.S_ISGID

// maxReaddirBytes caps one Readdir's reply whatever count the guest asks
// for (the virtio-9p device already clamps count to the negotiated msize).
const maxReaddirBytes = 1 << 20

// direntBufSize is the getdents64 buffer a Readdir reads the host
// directory with (pooled: at most one per request in flight).
const direntBufSize = 32 << 10

var direntBufs = sync.Pool{New: func() any { b := make([]byte, direntBufSize); return &b }}

// file is one node of an export, held by an O_PATH descriptor. The p9
// server may call its methods concurrently (reads and writes on one open
// file, for example); mu guards the mutable fields. Every method that
// uses a descriptor runs between f.ex.enter and f.ex.exit, so a withdrawn
// export's files fail with ESTALE and revoke never closes a descriptor an
// operation is using.
type file struct {
	ex *export

	// refs counts Close-pending owners: the p9 server's own reference
	// plus one per child whose parent this is. Descriptors are closed at 0:
	// a directory the client clunked or forgot keeps its descriptor while
	// a child holds it (Rename and a symlink's times need it), and that
	// descriptor stays counted in the export's budget until then.
	refs atomic.Int32

	mu     sync.Mutex
	fd     int    // O_PATH|O_NOFOLLOW descriptor of this node; -1 once closed
	parent *file  // the directory holding this node; nil for the export root
	name   string // name within parent ("" for the export root)
	mode   uint32 // st_mode at walk time (type bits are stable)
	openFd int    // real descriptor after Open/Create; -1 before
	dev    uint64 // st_dev of an open directory (its entries' QIDs)
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

var _ p9.File = (*file)(nil)

// newRootFile returns a File for the export's root directory (the view
// directory of a single-file export) and its attributes. Called between
// ex.enter and ex.exit.
func newRootFile(ex *export) (*file, *unix.Stat_t, error) {
	if err := ex.acquire(1); err != nil {
		return nil, nil, err
	}
	fd, err := unix.Openat2(ex.rootFd, ".", &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: resolveFlags,
	})
	if errors.Is(err, unix.ENOSYS) {
		fd, err = unix.Openat(ex.rootFd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		ex.release(1)
		return nil, nil, errno(err)
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
// following a symlink and never leaving dirFd.
func openBeneath(dirFd int, name string) (int, error) {
	if err := checkName(name); err != nil {
		return -1, err
	}
	fd, err := unix.Openat2(dirFd, name, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: resolveFlags,
	})
	if errors.Is(err, unix.ENOSYS) {
		// Kernels before 5.6: a single checked component opened with
		// O_NOFOLLOW relative to a held directory cannot escape either.
		fd, err = unix.Openat(dirFd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	return fd, errno(err)
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
		err = linux.ENOENT
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
		return nil, errno(err)
	}
	return &st, nil
}

// procPath names exactly the inode behind one of our own descriptors.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func dupFd(fd int) (int, error) {
	n, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	return n, errno(err)
}

func (f *file) isSymlink() bool { return f.mode&unix.S_IFMT == unix.S_IFLNK }
func (f *file) isDir() bool     { return f.mode&unix.S_IFMT == unix.S_IFDIR }

// sameExport returns other as a *file of f's export, or EXDEV.
func (f *file) sameExport(other p9.File) (*file, error) {
	o, ok := other.(*file)
	if !ok || o.ex != f.ex {
		return nil, linux.EXDEV
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
		return linux.EROFS
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
		err = linux.EPERM
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
// Exports.AddFile) for a fid that is not open; when the name no longer
// names a regular file, f keeps the one it had. Called with f.mu held,
// between enter and exit.
func (f *file) refresh() {
	if !f.ex.isFileView() || f.parent == nil || f.openFd >= 0 {
		return
	}
	fd, st, err := openRegularBeneath(f.ex.rootFd, f.ex.fileName)
	if err != nil {
		return
	}
	_ = unix.Close(f.fd)
	f.fd, f.mode = fd, st.Mode
}

// Walk implements p9.File. The server walks at most one name at a time.
func (f *file) Walk(names []string) ([]p9.QID, p9.File, error) {
	if err := f.ex.enter(); err != nil {
		return nil, nil, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch len(names) {
	case 0:
	case 1:
		if !f.isDir() {
			return nil, nil, linux.ENOTDIR
		}
	default:
		return nil, nil, linux.EINVAL
	}
	if err := f.ex.acquire(1); err != nil {
		return nil, nil, err
	}
	qids, nf, err := f.walkLocked(names)
	if err != nil {
		f.ex.release(1)
	}
	return qids, nf, err
}

// walkLocked opens the descriptor of Walk's new file (one, acquired by
// the caller): a clone of f, or its child names[0]. f.mu is held.
func (f *file) walkLocked(names []string) ([]p9.QID, p9.File, error) {
	if len(names) == 0 {
		fd, err := dupFd(f.fd)
		if err != nil {
			return nil, nil, err
		}
		return nil, newFile(f.ex, fd, f.parent, f.name, f.mode, -1), nil
	}
	if f.isViewRoot() {
		return f.walkView(names[0])
	}
	fd, err := openBeneath(f.fd, names[0])
	if err != nil {
		return nil, nil, err
	}
	st, err := fstat(fd)
	if err != nil {
		_ = unix.Close(fd)
		return nil, nil, err
	}
	return []p9.QID{qidFor(st)}, newFile(f.ex, fd, f, names[0], st.Mode, -1), nil
}

// walkView walks from a single-file export's directory to its one name.
func (f *file) walkView(name string) ([]p9.QID, p9.File, error) {
	if err := checkName(name); err != nil {
		return nil, nil, err
	}
	if name != f.ex.viewName {
		return nil, nil, linux.ENOENT
	}
	fd, st, err := openRegularBeneath(f.fd, f.ex.fileName)
	if err != nil {
		return nil, nil, err
	}
	return []p9.QID{qidFor(st)}, newFile(f.ex, fd, f, f.ex.fileName, st.Mode, -1), nil
}

// WalkGetAttr implements p9.File.
func (f *file) WalkGetAttr(names []string) ([]p9.QID, p9.File, p9.AttrMask, p9.Attr, error) {
	qids, nf, err := f.Walk(names)
	if err != nil {
		return nil, nil, p9.AttrMask{}, p9.Attr{}, err
	}
	_, valid, attr, err := nf.GetAttr(p9.AttrMaskAll)
	if err != nil {
		_ = nf.Close()
		return nil, nil, p9.AttrMask{}, p9.Attr{}, err
	}
	return qids, nf, valid, attr, nil
}

// StatFS implements p9.File.
func (f *file) StatFS() (p9.FSStat, error) {
	if err := f.ex.enter(); err != nil {
		return p9.FSStat{}, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	var st unix.Statfs_t
	if err := unix.Fstatfs(f.fd, &st); err != nil {
		return p9.FSStat{}, errno(err)
	}
	return p9.FSStat{
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

// GetAttr implements p9.File.
func (f *file) GetAttr(req p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	if err := f.ex.enter(); err != nil {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, err
	}
	defer f.ex.exit()
	st, err := f.stat()
	if err != nil {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, err
	}
	valid, attr := attrFor(st, req)
	return qidFor(st), valid, attr, nil
}

// stat returns the node's host attributes (a single-file export's file
// found again first). Called between enter and exit.
func (f *file) stat() (*unix.Stat_t, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refresh()
	return fstat(f.fd)
}

// SetAttr implements p9.File. Set-user-ID and set-group-ID bits are
// dropped from a new mode, and cleared before a truncation (killPriv); an
// owner other than the helper's own is refused (ownersStayOurs).
func (f *file) SetAttr(valid p9.SetAttrMask, attr p9.SetAttr) error {
	if err := f.beginMutation(); err != nil {
		return err
	}
	defer f.ex.exit()
	if f.isViewRoot() {
		return linux.EPERM // the host directory around the one file
	}
	if err := ownersStayOurs(valid, attr); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refresh()
	if f.isSymlink() {
		// Only times make sense on a link itself; do them by name with
		// AT_SYMLINK_NOFOLLOW (never through the link).
		if valid.Permissions || valid.Size || valid.UID || valid.GID {
			return linux.EOPNOTSUPP
		}
		if (valid.ATime || valid.MTime) && f.parent != nil {
			return errno(unix.UtimesNanoAt(f.parent.fd, f.name, setTimes(valid, attr), unix.AT_SYMLINK_NOFOLLOW))
		}
		return nil
	}
	if valid.Permissions {
		if err := unix.Chmod(procPath(f.fd), uint32(attr.Permissions)&0o7777&^privBits); err != nil {
			return errno(err)
		}
	}
	if valid.UID || valid.GID {
		uid, gid := -1, -1
		if valid.UID {
			uid = int(attr.UID)
		}
		if valid.GID {
			gid = int(attr.GID)
		}
		if err := unix.Fchownat(f.fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return errno(err)
		}
	}
	if valid.Size {
		if attr.Size > 1<<62 {
			return linux.EFBIG
		}
		if err := killPriv(f.fd); err != nil {
			return err
		}
		if err := unix.Truncate(procPath(f.fd), int64(attr.Size)); err != nil {
			return errno(err)
		}
	}
	if valid.ATime || valid.MTime {
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(f.fd), setTimes(valid, attr), 0); err != nil {
			return errno(err)
		}
	}
	return nil
}

// ownersStayOurs refuses (EPERM) a change of owner to any uid or gid
// but the helper's own effective ones, before anything reaches the host:
// a helper run as root could otherwise chown, and give a guest's file in
// a writable export to any user of the host. Our own uid or gid (or
// none) goes to the host as asked.
func ownersStayOurs(valid p9.SetAttrMask, attr p9.SetAttr) error {
	if valid.UID && uint32(attr.UID) != uint32(unix.Geteuid()) {
		return linux.EPERM
	}
	if valid.GID && uint32(attr.GID) != uint32(unix.Getegid()) {
		return linux.EPERM
	}
	return nil
}

// setTimes builds utimensat's times: given, "now", or left alone.
func setTimes(valid p9.SetAttrMask, attr p9.SetAttr) []unix.Timespec {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	if valid.ATime {
		ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
		if valid.ATimeNotSystemTime {
			ts[0] = unix.Timespec{Sec: int64(attr.ATimeSeconds), Nsec: int64(attr.ATimeNanoSeconds % 1e9)}
		}
	}
	if valid.MTime {
		ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
		if valid.MTimeNotSystemTime {
			ts[1] = unix.Timespec{Sec: int64(attr.MTimeSeconds), Nsec: int64(attr.MTimeNanoSeconds % 1e9)}
		}
	}
	return ts
}

// Close implements p9.File: the server's reference goes; the descriptors
// stay while children still use this directory.
func (f *file) Close() error {
	f.mu.Lock()
	f.closeOpen()
	f.mu.Unlock()
	f.unref()
	return nil
}

// Open implements p9.File. Only regular files and directories are opened
// on the host (a FIFO or device node would block or reach host devices).
func (f *file) Open(flags p9.OpenFlags) (p9.QID, uint32, error) {
	if err := f.ex.enter(); err != nil {
		return p9.QID{}, 0, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refresh()
	if f.openFd >= 0 {
		return p9.QID{}, 0, linux.EINVAL
	}
	mode := flags.Mode()
	writes := mode == p9.WriteOnly || mode == p9.ReadWrite || uint32(flags)&unix.O_TRUNC != 0
	if writes && f.ex.readOnly {
		return p9.QID{}, 0, linux.EROFS
	}
	var osFlags int
	switch f.mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if mode != p9.ReadOnly {
			return p9.QID{}, 0, linux.EISDIR
		}
		osFlags = unix.O_RDONLY | unix.O_DIRECTORY
	case unix.S_IFREG:
		osFlags = flags.OSFlags() | int(uint32(flags)&passOpenFlags)
	default:
		return p9.QID{}, 0, linux.EPERM
	}
	if err := f.ex.acquire(1); err != nil {
		return p9.QID{}, 0, err
	}
	fd, err := unix.Open(procPath(f.fd), osFlags|unix.O_CLOEXEC, 0)
	if err != nil {
		f.ex.release(1)
		return p9.QID{}, 0, errno(err)
	}
	st, err := fstat(fd)
	if err == nil && osFlags&unix.O_TRUNC != 0 {
		err = killPriv(fd)
	}
	if err != nil {
		_ = unix.Close(fd)
		f.ex.release(1)
		return p9.QID{}, 0, err
	}
	f.openFd = fd
	f.dev = st.Dev
	return qidFor(st), 0, nil
}

// openDescriptor returns the descriptor of an open file. The caller is
// between enter and exit, so the descriptor stays open while it uses it:
// only revoke (excluded by enter) and the last Close (which the server
// never runs beside another operation on the fid) close it.
func (f *file) openDescriptor() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.openFd < 0 {
		return -1, linux.EBADF
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
	return errno(unix.Chmod(procPath(fd), st.Mode&0o7777&^kill))
}

// ReadAt implements p9.File: ReadvAt over the one buffer.
func (f *file) ReadAt(p []byte, offset int64) (int, error) {
	return f.ReadvAt([][]byte{p}, offset)
}

// WriteAt implements p9.File: WritevAt from the one buffer (a set-user-ID
// or set-group-ID bit of the file is cleared first).
func (f *file) WriteAt(p []byte, offset int64) (int, error) {
	return f.WritevAt([][]byte{p}, offset)
}

// SetXattr implements p9.File: not supported.
func (f *file) SetXattr(string, []byte, p9.XattrFlags) error {
	if err := f.beginMutation(); err != nil {
		return err
	}
	defer f.ex.exit()
	return linux.EOPNOTSUPP
}

// GetXattr implements p9.File: no attribute exists.
func (f *file) GetXattr(string) ([]byte, error) {
	if err := f.ex.enter(); err != nil {
		return nil, err
	}
	f.ex.exit()
	return nil, linux.ENODATA
}

// ListXattrs implements p9.File: none.
func (f *file) ListXattrs() ([]string, error) {
	if err := f.ex.enter(); err != nil {
		return nil, err
	}
	f.ex.exit()
	return nil, nil
}

// RemoveXattr implements p9.File: not supported.
func (f *file) RemoveXattr(string) error {
	if err := f.beginMutation(); err != nil {
		return err
	}
	defer f.ex.exit()
	return linux.EOPNOTSUPP
}

// FSync implements p9.File.
func (f *file) FSync() error {
	if err := f.ex.enter(); err != nil {
		return err
	}
	defer f.ex.exit()
	fd, err := f.openDescriptor()
	if err != nil {
		return nil // nothing written through this fid
	}
	return errno(unix.Fsync(fd))
}

// Lock implements p9.File: local-only semantics (see the package doc).
func (f *file) Lock(int, p9.LockType, p9.LockFlags, uint64, uint64, string) (p9.LockStatus, error) {
	if err := f.ex.enter(); err != nil {
		return p9.LockStatusError, err
	}
	f.ex.exit()
	return p9.LockStatusOK, nil
}

// Create implements p9.File.
func (f *file) Create(name string, flags p9.OpenFlags, perm p9.FileMode, _ p9.UID, _ p9.GID) (p9.File, p9.QID, uint32, error) {
	if err := f.beginNames(name); err != nil {
		return nil, p9.QID{}, 0, err
	}
	defer f.ex.exit()
	if err := f.ex.acquire(2); err != nil { // the open file and its O_PATH
		return nil, p9.QID{}, 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	nf, qid, err := f.createLocked(name, flags, perm)
	if err != nil {
		f.ex.release(2)
		return nil, p9.QID{}, 0, err
	}
	return nf, qid, 0, nil
}

// createLocked creates name open with flags and returns its file, holding
// both descriptors (acquired by the caller). f.mu is held.
func (f *file) createLocked(name string, flags p9.OpenFlags, perm p9.FileMode) (*file, p9.QID, error) {
	osFlags := flags.OSFlags() | int(uint32(flags)&passOpenFlags)
	mode := uint32(perm.Permissions()) &^ privBits
	openFd, err := unix.Openat2(f.fd, name, &unix.OpenHow{
		Flags:   uint64(osFlags | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: resolveFlags,
	})
	if errors.Is(err, unix.ENOSYS) {
		openFd, err = unix.Openat(f.fd, name, osFlags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	}
	if err != nil {
		return nil, p9.QID{}, errno(err)
	}
	pathFd, err := unix.Open(procPath(openFd), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Close(openFd)
		return nil, p9.QID{}, errno(err)
	}
	st, err := fstat(pathFd)
	if err == nil {
		nf := newFile(f.ex, pathFd, f, name, st.Mode, openFd)
		nf.dev = st.Dev
		return nf, qidFor(st), nil
	}
	_ = unix.Close(pathFd)
	_ = unix.Close(openFd)
	return nil, p9.QID{}, err
}

// statChild returns the QID of name in this directory, without following it.
func (f *file) statChild(name string) (p9.QID, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(f.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return p9.QID{}, errno(err)
	}
	return qidFor(&st), nil
}

// Mkdir implements p9.File.
// Set-user-ID and set-group-ID bits are dropped from the mode (a
// directory's set-group-ID bit only makes new entries inherit its group,
// but the guest has no say in host groups; the host may still set it when
// the parent directory has it).
func (f *file) Mkdir(name string, perm p9.FileMode, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := f.beginNames(name); err != nil {
		return p9.QID{}, err
	}
	defer f.ex.exit()
	if err := unix.Mkdirat(f.fd, name, uint32(perm.Permissions())&^privBits); err != nil {
		return p9.QID{}, errno(err)
	}
	return f.statChild(name)
}

// Symlink implements p9.File. The target is stored as given: it is only
// ever resolved by the guest, in the guest.
func (f *file) Symlink(target, name string, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := f.beginNames(name); err != nil {
		return p9.QID{}, err
	}
	defer f.ex.exit()
	if target == "" || len(target) >= unix.PathMax {
		return p9.QID{}, linux.EINVAL
	}
	if err := unix.Symlinkat(target, f.fd, name); err != nil {
		return p9.QID{}, errno(err)
	}
	return f.statChild(name)
}

// Link implements p9.File (a hard link to target, in this directory).
func (f *file) Link(target p9.File, name string) error {
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
		return linux.EPERM
	}
	// linkat with AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the /proc link
	// of our own descriptor names the same inode without it.
	return errno(unix.Linkat(unix.AT_FDCWD, procPath(tfd), f.fd, name, unix.AT_SYMLINK_FOLLOW))
}

// Mknod implements p9.File: regular files, FIFOs and sockets only.
// Set-user-ID and set-group-ID bits are dropped from the mode.
func (f *file) Mknod(name string, mode p9.FileMode, _, _ uint32, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := f.beginNames(name); err != nil {
		return p9.QID{}, err
	}
	defer f.ex.exit()
	typ := uint32(mode) & unix.S_IFMT
	switch typ {
	case 0, unix.S_IFREG, unix.S_IFIFO, unix.S_IFSOCK:
	default:
		return p9.QID{}, linux.EPERM
	}
	if err := unix.Mknodat(f.fd, name, typ|uint32(mode.Permissions())&^privBits, 0); err != nil {
		return p9.QID{}, errno(err)
	}
	return f.statChild(name)
}

// Rename implements p9.File (Trename: this node moves to newDir/newName).
func (f *file) Rename(newDir p9.File, newName string) error {
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
		return linux.EBUSY // the export root itself
	}
	return errno(unix.Renameat(parent.fd, name, nd.fd, newName))
}

// RenameAt implements p9.File (Trenameat: oldName in this directory).
func (f *file) RenameAt(oldName string, newDir p9.File, newName string) error {
	if err := f.beginNames(oldName, newName); err != nil {
		return err
	}
	defer f.ex.exit()
	nd, err := f.sameExport(newDir)
	if err != nil {
		return err
	}
	return errno(unix.Renameat(f.fd, oldName, nd.fd, newName))
}

// UnlinkAt implements p9.File.
func (f *file) UnlinkAt(name string, flags uint32) error {
	if err := f.beginNames(name); err != nil {
		return err
	}
	defer f.ex.exit()
	return errno(unix.Unlinkat(f.fd, name, int(flags)&unix.AT_REMOVEDIR))
}

// Readdir implements p9.File. Nothing is cached between calls: the offset
// is the host's own position in the directory (getdents64's d_off, the
// cookie lseek takes back; 0 is the start), so each call seeks the open
// directory there and reads on, as much as fits count bytes. A directory
// listing holds no memory between requests, however many fids list it.
func (f *file) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	if err := f.ex.enter(); err != nil {
		return nil, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.openFd < 0 || !f.isDir() {
		return nil, linux.EBADF
	}
	count = min(count, maxReaddirBytes)
	if f.isViewRoot() {
		return f.viewDirents(offset, count)
	}
	return readDir(f.openFd, f.dev, offset, count)
}

// direntSize is what one entry takes in an Rreaddir: qid[13] offset[8]
// type[1] name[s].
func direntSize(name string) uint32 { return uint32(13 + 8 + 1 + 2 + len(name)) }

// fitDirents returns the entries from ents that fit count bytes.
func fitDirents(ents p9.Dirents, count uint32, used *uint32) (p9.Dirents, bool) {
	for i, d := range ents {
		size := direntSize(d.Name)
		if *used+size > count {
			return ents[:i], false
		}
		*used += size
	}
	return ents, true
}

// readDir reads the directory open as fd from the host position offset
// with getdents64, as many entries as fit count bytes. QID paths are
// derived as in qidFor, with the directory's device.
func readDir(fd int, dev uint64, offset uint64, count uint32) (p9.Dirents, error) {
	if offset > math.MaxInt64 {
		return nil, nil // no host position: the end
	}
	if _, err := unix.Seek(fd, int64(offset), io.SeekStart); err != nil {
		return nil, errno(err)
	}
	bp := direntBufs.Get().(*[]byte)
	defer direntBufs.Put(bp)
	var out p9.Dirents
	used := uint32(0)
	for {
		n, err := unix.Getdents(fd, *bp)
		if err != nil {
			if len(out) > 0 {
				return out, nil // the next call meets the error again
			}
			return nil, errno(err)
		}
		if n <= 0 {
			return out, nil
		}
		ents, err := parseDirents((*bp)[:n], dev)
		if err != nil {
			return nil, err
		}
		fit, all := fitDirents(ents, count, &used)
		out = append(out, fit...)
		if !all {
			return out, nil
		}
	}
}

// parseDirents decodes a getdents64 buffer: ino[8] off[8] reclen[2]
// type[1] name (NUL-terminated, padded).
func parseDirents(b []byte, dev uint64) (p9.Dirents, error) {
	var ents p9.Dirents
	for len(b) >= 19 {
		ino, off := leUint64(b[0:8]), leUint64(b[8:16])
		reclen := int(uint16(b[16]) | uint16(b[17])<<8)
		if reclen < 19 || reclen > len(b) {
			return nil, linux.EIO
		}
		typ := b[18]
		nameBytes := b[19:reclen]
		for i, c := range nameBytes {
			if c == 0 {
				nameBytes = nameBytes[:i]
				break
			}
		}
		b = b[reclen:]
		qt := direntQIDType(typ)
		ents = append(ents, p9.Dirent{
			QID:    p9.QID{Type: qt, Path: ino ^ (dev * qidDevMix)},
			Offset: off,
			Type:   qt,
			Name:   string(nameBytes),
		})
	}
	return ents, nil
}

// viewDirents lists a single-file export's directory: ".", ".." and the
// one name while it names a regular file, at offsets 1, 2, 3.
func (f *file) viewDirents(offset uint64, count uint32) (p9.Dirents, error) {
	st, err := fstat(f.fd)
	if err != nil {
		return nil, err
	}
	dir := qidFor(st)
	ents := p9.Dirents{
		{QID: dir, Offset: 1, Type: dir.Type, Name: "."},
		{QID: dir, Offset: 2, Type: dir.Type, Name: ".."},
	}
	if fd, fst, err := openRegularBeneath(f.fd, f.ex.fileName); err == nil {
		_ = unix.Close(fd)
		q := qidFor(fst)
		ents = append(ents, p9.Dirent{QID: q, Offset: 3, Type: q.Type, Name: f.ex.viewName})
	}
	if offset >= uint64(len(ents)) {
		return nil, nil
	}
	used := uint32(0)
	fit, _ := fitDirents(ents[offset:], count, &used)
	return fit, nil
}

func leUint64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

func direntQIDType(t byte) p9.QIDType {
	switch t {
	case unix.DT_DIR:
		return p9.TypeDir
	case unix.DT_LNK:
		return p9.TypeSymlink
	}
	return p9.TypeRegular
}

// Readlink implements p9.File.
func (f *file) Readlink() (string, error) {
	if err := f.ex.enter(); err != nil {
		return "", err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.isSymlink() {
		return "", linux.EINVAL
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(f.fd, "", buf)
	if err != nil {
		return "", errno(err)
	}
	return string(buf[:n]), nil
}

// Renamed implements p9.File: the server tells us our new parent and name.
func (f *file) Renamed(newDir p9.File, newName string) {
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
