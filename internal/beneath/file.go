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

// ReadFile reads the regular file rel (a relative path, several components
// allowed) beneath d, of at most max bytes: a symlink at any component
// fails (ELOOP), as do a way out of d and a mount point crossed (EXDEV); a
// name that is not a regular file fails with ErrNotRegular, a file over max
// bytes (also one that grows past it while read) with ErrTooLarge.
func (d *Dir) ReadFile(rel string, max int64) ([]byte, error) {
	fd, err := d.openat2(rel, fileHow)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), d.path+"/"+rel)
	defer f.Close()
	var st unix.Stat_t
	if err := retry(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return nil, d.err("fstat", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, d.err("open", rel, ErrNotRegular)
	}
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
