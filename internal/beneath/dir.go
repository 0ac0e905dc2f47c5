package beneath

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// MaxDepth is how many directory levels RemoveAll and SizeOf descend below
// the entry they are given.
const MaxDepth = 256

// maxVisits is how many entries one RemoveAll or SizeOf call looks at (a
// variable so that tests can lower it).
var maxVisits = 1 << 20

const (
	batchNames  = 256  // names read from a directory at a time
	direntBytes = 8192 // a directory's getdents buffer
)

var (
	// ErrTooDeep: a tree goes deeper than MaxDepth.
	ErrTooDeep = errors.New("tree is deeper than the limit")
	// ErrTooMany: a tree has more entries than one call looks at.
	ErrTooMany = errors.New("tree has more entries than the limit")
	// ErrBadName: a name that is not one entry of a directory.
	ErrBadName = errors.New("not a single entry name")
)

// openHow opens a directory beneath another, refusing symlinks (and /proc
// magic links) at every component, ".." out of it (Confined) and mount
// points.
var openHow = unix.OpenHow{
	Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
	Resolve: Confined | unix.RESOLVE_NO_XDEV,
}

// Dir is an open directory. It is not safe for concurrent use: it keeps
// its read position.
type Dir struct {
	fd   int
	path string // for messages only
	buf  []byte // getdents records, buf[bufp:nbuf] not yet parsed
	bufp int
	nbuf int
}

// Entry is an entry of a directory with its own fstatat information (a
// symlink's, not its target's).
type Entry struct {
	Name string
	Stat unix.Stat_t
}

// IsDir says whether the entry is a directory (a symlink never is).
func (e Entry) IsDir() bool { return e.Stat.Mode&unix.S_IFMT == unix.S_IFDIR }

// ModTime is the entry's last modification time.
func (e Entry) ModTime() time.Time { return time.Unix(e.Stat.Mtim.Unix()) }

// Open opens the directory at path, which the caller trusts; a symlink as
// its last component is refused.
func Open(path string) (*Dir, error) {
	fd, err := retryN(func() (int, error) {
		return unix.Open(path, int(openHow.Flags), 0)
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{fd: fd, path: path}, nil
}

// OpenDir opens the directory rel (a relative path) beneath d with openat2:
// a symlink fails with ELOOP (ENOTDIR as the last component), as does a
// non-directory (ENOTDIR), a way out of d or across a mount point (EXDEV).
func (d *Dir) OpenDir(rel string) (*Dir, error) {
	fd, err := d.openat2(rel, openHow)
	if err != nil {
		return nil, err
	}
	return &Dir{fd: fd, path: d.path + "/" + rel}, nil
}

// openat2 opens rel, a relative path, beneath d as how says (OpenAt).
func (d *Dir) openat2(rel string, how unix.OpenHow) (int, error) {
	fd, err := OpenAt(d.fd, rel, how)
	if err != nil {
		return -1, d.err("openat2", rel, err)
	}
	return fd, nil
}

// Close closes the directory.
func (d *Dir) Close() error {
	if err := unix.Close(d.fd); err != nil {
		return d.err("close", "", err)
	}
	d.fd = -1
	return nil
}

// Stat is fstatat(AT_SYMLINK_NOFOLLOW) of the entry name.
func (d *Dir) Stat(name string) (Entry, error) {
	e := Entry{Name: name}
	if err := checkName(name); err != nil {
		return e, d.err("fstatat", name, err)
	}
	err := retry(func() error {
		return unix.Fstatat(d.fd, name, &e.Stat, unix.AT_SYMLINK_NOFOLLOW)
	})
	if err != nil {
		return e, d.err("fstatat", name, err)
	}
	return e, nil
}

// Mkdir makes the directory name in d.
func (d *Dir) Mkdir(name string, perm uint32) error {
	if err := checkName(name); err != nil {
		return d.err("mkdirat", name, err)
	}
	if err := retry(func() error { return unix.Mkdirat(d.fd, name, perm) }); err != nil {
		return d.err("mkdirat", name, err)
	}
	return nil
}

// Statfs describes the filesystem d is on.
func (d *Dir) Statfs() (unix.Statfs_t, error) {
	var st unix.Statfs_t
	if err := retry(func() error { return unix.Fstatfs(d.fd, &st) }); err != nil {
		return st, d.err("fstatfs", "", err)
	}
	return st, nil
}

// Entries lists d from its start: at most max entries, each with its
// Stat; the rest are left for a later call. Entries that vanish while it
// lists are left out.
func (d *Dir) Entries(max int) ([]Entry, error) {
	if err := d.rewind(); err != nil {
		return nil, err
	}
	var out []Entry
	for len(out) < max {
		names, err := d.readNames(min(batchNames, max-len(out)))
		if err != nil || len(names) == 0 {
			return out, err
		}
		for _, n := range names {
			e, err := d.Stat(n)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return out, err
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// readNames reads up to n more names ("." and ".." left out); none at
// the end of the directory.
func (d *Dir) readNames(n int) ([]string, error) {
	var names []string
	for len(names) < n {
		if d.bufp >= d.nbuf {
			if err := d.fill(); err != nil || d.nbuf == 0 {
				return names, err
			}
		}
		used, _, more := unix.ParseDirent(d.buf[d.bufp:d.nbuf], n-len(names), names)
		d.bufp += used
		names = more
	}
	return names, nil
}

// fill reads the next getdents records into d.buf.
func (d *Dir) fill() error {
	if d.buf == nil {
		d.buf = make([]byte, direntBytes)
	}
	n, err := retryN(func() (int, error) { return unix.Getdents(d.fd, d.buf) })
	d.bufp, d.nbuf = 0, max(n, 0)
	if err != nil {
		return d.err("getdents", "", err)
	}
	return nil
}

// rewind moves d's read position back to its start.
func (d *Dir) rewind() error {
	d.bufp, d.nbuf = 0, 0
	if _, err := unix.Seek(d.fd, 0, io.SeekStart); err != nil {
		return d.err("lseek", "", err)
	}
	return nil
}

// unlink is unlinkat of the entry name with flags.
func (d *Dir) unlink(name string, flags int) error {
	if err := retry(func() error { return unix.Unlinkat(d.fd, name, flags) }); err != nil {
		return d.err("unlinkat", name, err)
	}
	return nil
}

func (d *Dir) err(op, name string, err error) error {
	p := d.path
	if name != "" {
		p += "/" + name
	}
	return &fs.PathError{Op: op, Path: p, Err: err}
}

// checkName refuses what is not a single entry name: "", ".", ".." and
// anything with a '/' (whose earlier components a *at call would follow).
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("%q: %w", name, ErrBadName)
	}
	return nil
}

// retry runs a system call again while it is interrupted.
func retry(call func() error) error {
	_, err := retryN(func() (struct{}, error) { return struct{}{}, call() })
	return err
}

// retryN is retry for a call that returns a value.
func retryN[T any](call func() (T, error)) (T, error) {
	for {
		v, err := call()
		if !errors.Is(err, unix.EINTR) {
			return v, err
		}
	}
}
