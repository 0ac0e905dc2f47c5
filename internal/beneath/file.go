package beneath

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotRegular: a name that is not a regular file (a directory, a FIFO, a
// device, a socket).
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge: a file larger than the caller reads.
var ErrTooLarge = errors.New("file is larger than the limit")

// fileHow opens a file beneath a directory as openHow opens a directory:
// no symlink (or /proc magic link) at any component, no ".." out of it, no
// mount point crossed. O_NONBLOCK keeps a FIFO from blocking the open (it
// is refused just after); O_NOCTTY keeps a terminal from becoming ours.
var fileHow = unix.OpenHow{
	Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
	Resolve: openHow.Resolve,
}

// OpenFile opens the regular file rel (a relative path, several
// components allowed) beneath d for reading, returning its fstat too: a
// symlink at any component fails (ELOOP), as do a way out of d and a mount
// point crossed (EXDEV); a name that is not a regular file fails with
// ErrNotRegular. The caller closes the file.
func (d *Dir) OpenFile(rel string) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := d.openat2(rel, fileHow)
	if err != nil {
		return nil, st, err
	}
	f := os.NewFile(uintptr(fd), d.path+"/"+rel)
	if err := retry(func() error { return unix.Fstat(fd, &st) }); err != nil {
		f.Close()
		return nil, st, d.err("fstat", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, st, d.err("open", rel, ErrNotRegular)
	}
	return f, st, nil
}

// ReadFile reads the regular file rel beneath d as OpenFile opens it, of
// at most max bytes: a file over max bytes (also one that grows past it
// while read) fails with ErrTooLarge.
func (d *Dir) ReadFile(rel string, max int64) ([]byte, error) {
	f, st, err := d.OpenFile(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st.Size > max {
		return nil, d.err("read", rel, fmt.Errorf("%w: %d bytes, more than %d", ErrTooLarge, st.Size, max))
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, d.err("read", rel, err)
	}
	if int64(len(data)) > max {
		return nil, d.err("read", rel, fmt.Errorf("%w: it grew past %d bytes", ErrTooLarge, max))
	}
	return data, nil
}

// Remove removes the entry name of d that is not a directory (unlinkat
// without AT_REMOVEDIR): a symlink is removed itself, never its target.
func (d *Dir) Remove(name string) error {
	if err := checkName(name); err != nil {
		return d.err("unlinkat", name, err)
	}
	return d.unlink(name, 0)
}

// CreateFile makes the regular file name (a single entry) in d, with perm
// (less the umask), and opens it for writing: a name that exists, a
// symlink too, fails with EEXIST and is left as it is. The caller closes
// the file.
func (d *Dir) CreateFile(name string, perm uint32) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, d.err("openat2", name, err)
	}
	how := unix.OpenHow{Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW, Mode: uint64(perm), Resolve: unix.RESOLVE_NO_XDEV}
	fd, err := d.openat2(name, how)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), d.path+"/"+name), nil
}
