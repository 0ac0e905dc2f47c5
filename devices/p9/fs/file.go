package fs

import (
	"errors"
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

// maxDirEntries bounds a directory listing held in memory for one open
// directory.
const maxDirEntries = 1 << 20

// file is one node of an export, held by an O_PATH descriptor. The p9
// server may call its methods concurrently (reads and writes on one open
// file, for example); mu guards the mutable fields.
type file struct {
	ex *export

	// refs counts Close-pending owners: the p9 server's own reference
	// plus one per child whose parent this is. Descriptors are closed at 0.
	refs atomic.Int32

	mu      sync.Mutex
	fd      int    // O_PATH|O_NOFOLLOW descriptor of this node
	parent  *file  // the directory holding this node; nil for the export root
	name    string // name within parent ("" for the export root)
	mode    uint32 // st_mode at walk time (type bits are stable)
	openFd  int    // real descriptor after Open/Create; -1 before
	dirents []p9.Dirent
}

// newFile returns a file with one reference, taking a reference on parent
// and on the export.
func newFile(ex *export, fd int, parent *file, name string, mode uint32, openFd int) *file {
	f := &file{ex: ex, fd: fd, parent: parent, name: name, mode: mode, openFd: openFd}
	f.refs.Store(1)
	if parent != nil {
		parent.refs.Add(1)
	}
	ex.acquire()
	return f
}

// unref drops one reference; the last one closes the descriptors.
func (f *file) unref() {
	if f.refs.Add(-1) != 0 {
		return
	}
	f.mu.Lock()
	for _, fd := range []*int{&f.openFd, &f.fd} {
		if *fd >= 0 {
			_ = unix.Close(*fd)
			*fd = -1
		}
	}
	f.dirents = nil
	parent := f.parent
	f.parent = nil
	f.mu.Unlock()
	if parent != nil {
		parent.unref()
	}
	f.ex.release()
}

// parentAndName returns the current parent and name under f.mu.
func (f *file) parentAndName() (*file, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.parent, f.name
}

var _ p9.File = (*file)(nil)

// newRootFile returns a File for the export's root directory.
func newRootFile(ex *export) (*file, error) {
	fd, err := unix.Openat2(ex.rootFd, ".", &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: resolveFlags,
	})
	if errors.Is(err, unix.ENOSYS) {
		fd, err = unix.Openat(ex.rootFd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, errno(err)
	}
	st, err := fstat(fd)
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	f := newFile(ex, fd, nil, "", st.Mode, -1)
	ex.release() // newFile took its own reference; the caller's is handed over
	return f, nil
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

func (f *file) mutable() error {
	if f.ex.readOnly {
		return linux.EROFS
	}
	return nil
}

// Walk implements p9.File. The server walks at most one name at a time.
func (f *file) Walk(names []string) ([]p9.QID, p9.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch len(names) {
	case 0:
		fd, err := dupFd(f.fd)
		if err != nil {
			return nil, nil, err
		}
		return nil, newFile(f.ex, fd, f.parent, f.name, f.mode, -1), nil
	case 1:
	default:
		return nil, nil, linux.EINVAL
	}
	if !f.isDir() {
		return nil, nil, linux.ENOTDIR
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
	st, err := fstat(f.fd)
	if err != nil {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, err
	}
	valid, attr := attrFor(st, req)
	return qidFor(st), valid, attr, nil
}

// SetAttr implements p9.File.
func (f *file) SetAttr(valid p9.SetAttrMask, attr p9.SetAttr) error {
	if err := f.mutable(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
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
		if err := unix.Chmod(procPath(f.fd), uint32(attr.Permissions)&0o7777); err != nil {
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
	if f.openFd >= 0 {
		_ = unix.Close(f.openFd)
		f.openFd = -1
	}
	f.dirents = nil
	f.mu.Unlock()
	f.unref()
	return nil
}

// Open implements p9.File. Only regular files and directories are opened
// on the host (a FIFO or device node would block or reach host devices).
func (f *file) Open(flags p9.OpenFlags) (p9.QID, uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
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
	fd, err := unix.Open(procPath(f.fd), osFlags|unix.O_CLOEXEC, 0)
	if err != nil {
		return p9.QID{}, 0, errno(err)
	}
	st, err := fstat(fd)
	if err != nil {
		_ = unix.Close(fd)
		return p9.QID{}, 0, err
	}
	f.openFd = fd
	f.dirents = nil
	return qidFor(st), 0, nil
}

func (f *file) openDescriptor() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.openFd < 0 {
		return -1, linux.EBADF
	}
	return f.openFd, nil
}

// ReadAt implements p9.File.
func (f *file) ReadAt(p []byte, offset int64) (int, error) {
	fd, err := f.openDescriptor()
	if err != nil {
		return 0, err
	}
	if offset < 0 {
		return 0, linux.EINVAL
	}
	n, err := unix.Pread(fd, p, offset)
	if n < 0 {
		n = 0
	}
	return n, errno(err)
}

// WriteAt implements p9.File.
func (f *file) WriteAt(p []byte, offset int64) (int, error) {
	if err := f.mutable(); err != nil {
		return 0, err
	}
	fd, err := f.openDescriptor()
	if err != nil {
		return 0, err
	}
	if offset < 0 {
		return 0, linux.EINVAL
	}
	n, err := unix.Pwrite(fd, p, offset)
	if n < 0 {
		n = 0
	}
	return n, errno(err)
}

// SetXattr implements p9.File: not supported.
func (f *file) SetXattr(string, []byte, p9.XattrFlags) error {
	if err := f.mutable(); err != nil {
		return err
	}
	return linux.EOPNOTSUPP
}

// GetXattr implements p9.File: no attribute exists.
func (f *file) GetXattr(string) ([]byte, error) { return nil, linux.ENODATA }

// ListXattrs implements p9.File: none.
func (f *file) ListXattrs() ([]string, error) { return nil, nil }

// RemoveXattr implements p9.File: not supported.
func (f *file) RemoveXattr(string) error {
	if err := f.mutable(); err != nil {
		return err
	}
	return linux.EOPNOTSUPP
}

// FSync implements p9.File.
func (f *file) FSync() error {
	fd, err := f.openDescriptor()
	if err != nil {
		return nil // nothing written through this fid
	}
	return errno(unix.Fsync(fd))
}

// Lock implements p9.File: local-only semantics (see the package doc).
func (f *file) Lock(int, p9.LockType, p9.LockFlags, uint64, uint64, string) (p9.LockStatus, error) {
	return p9.LockStatusOK, nil
}

// Create implements p9.File.
func (f *file) Create(name string, flags p9.OpenFlags, perm p9.FileMode, _ p9.UID, _ p9.GID) (p9.File, p9.QID, uint32, error) {
	if err := f.mutable(); err != nil {
		return nil, p9.QID{}, 0, err
	}
	if err := checkName(name); err != nil {
		return nil, p9.QID{}, 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	osFlags := flags.OSFlags() | int(uint32(flags)&passOpenFlags)
	openFd, err := unix.Openat2(f.fd, name, &unix.OpenHow{
		Flags:   uint64(osFlags | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Mode:    uint64(perm.Permissions()),
		Resolve: resolveFlags,
	})
	if errors.Is(err, unix.ENOSYS) {
		openFd, err = unix.Openat(f.fd, name, osFlags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Permissions()))
	}
	if err != nil {
		return nil, p9.QID{}, 0, errno(err)
	}
	pathFd, err := unix.Open(procPath(openFd), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Close(openFd)
		return nil, p9.QID{}, 0, errno(err)
	}
	st, err := fstat(pathFd)
	if err == nil {
		return newFile(f.ex, pathFd, f, name, st.Mode, openFd), qidFor(st), 0, nil
	}
	_ = unix.Close(pathFd)
	_ = unix.Close(openFd)
	return nil, p9.QID{}, 0, err
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
func (f *file) Mkdir(name string, perm p9.FileMode, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := f.mutable(); err != nil {
		return p9.QID{}, err
	}
	if err := checkName(name); err != nil {
		return p9.QID{}, err
	}
	if err := unix.Mkdirat(f.fd, name, uint32(perm.Permissions())); err != nil {
		return p9.QID{}, errno(err)
	}
	return f.statChild(name)
}

// Symlink implements p9.File. The target is stored as given: it is only
// ever resolved by the guest, in the guest.
func (f *file) Symlink(target, name string, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := f.mutable(); err != nil {
		return p9.QID{}, err
	}
	if err := checkName(name); err != nil {
		return p9.QID{}, err
	}
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
	if err := f.mutable(); err != nil {
		return err
	}
	if err := checkName(name); err != nil {
		return err
	}
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
func (f *file) Mknod(name string, mode p9.FileMode, _, _ uint32, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := f.mutable(); err != nil {
		return p9.QID{}, err
	}
	if err := checkName(name); err != nil {
		return p9.QID{}, err
	}
	typ := uint32(mode) & unix.S_IFMT
	switch typ {
	case 0, unix.S_IFREG, unix.S_IFIFO, unix.S_IFSOCK:
	default:
		return p9.QID{}, linux.EPERM
	}
	if err := unix.Mknodat(f.fd, name, typ|uint32(mode.Permissions()), 0); err != nil {
		return p9.QID{}, errno(err)
	}
	return f.statChild(name)
}

// Rename implements p9.File (Trename: this node moves to newDir/newName).
func (f *file) Rename(newDir p9.File, newName string) error {
	if err := f.mutable(); err != nil {
		return err
	}
	if err := checkName(newName); err != nil {
		return err
	}
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
	if err := f.mutable(); err != nil {
		return err
	}
	if err := checkName(oldName); err != nil {
		return err
	}
	if err := checkName(newName); err != nil {
		return err
	}
	nd, err := f.sameExport(newDir)
	if err != nil {
		return err
	}
	return errno(unix.Renameat(f.fd, oldName, nd.fd, newName))
}

// UnlinkAt implements p9.File.
func (f *file) UnlinkAt(name string, flags uint32) error {
	if err := f.mutable(); err != nil {
		return err
	}
	if err := checkName(name); err != nil {
		return err
	}
	return errno(unix.Unlinkat(f.fd, name, int(flags)&unix.AT_REMOVEDIR))
}

// Readdir implements p9.File. Offsets are entry indices: the listing is
// read from the host when offset is 0 (or nothing is cached) and served
// from that snapshot after, as much as fits count bytes.
func (f *file) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.openFd < 0 || !f.isDir() {
		return nil, linux.EBADF
	}
	if offset == 0 || f.dirents == nil {
		st, err := fstat(f.openFd)
		if err != nil {
			return nil, err
		}
		ents, err := readDir(f.openFd, st.Dev)
		if err != nil {
			return nil, err
		}
		f.dirents = ents
	}
	if offset >= uint64(len(f.dirents)) {
		return nil, nil
	}
	var out p9.Dirents
	used := uint32(0)
	for _, d := range f.dirents[offset:] {
		size := uint32(13 + 8 + 1 + 2 + len(d.Name)) // qid, offset, type, name
		if used+size > count {
			break
		}
		used += size
		out = append(out, d)
	}
	return out, nil
}

// readDir reads a whole directory from the start with getdents64.
// QID paths are derived as in qidFor, with the directory's device.
func readDir(fd int, dev uint64) ([]p9.Dirent, error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, errno(err)
	}
	buf := make([]byte, 32*1024)
	ents := []p9.Dirent{}
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, errno(err)
		}
		if n <= 0 {
			return ents, nil
		}
		b := buf[:n]
		for len(b) >= 19 {
			ino := leUint64(b[0:8])
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
			if len(ents) >= maxDirEntries {
				return nil, linux.ENOMEM
			}
			qt := direntQIDType(typ)
			ents = append(ents, p9.Dirent{
				QID:    p9.QID{Type: qt, Path: ino ^ (dev * qidDevMix)},
				Offset: uint64(len(ents) + 1),
				Type:   qt,
				Name:   string(nameBytes),
			})
		}
	}
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
