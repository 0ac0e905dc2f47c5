package agent

// Mount points, resolved and held by descriptor.
//
// Every target the agent mounts on, and every directory or file it makes
// on the way to one, may lie in a tree that guest processes write: a
// session's home and what is mounted below it (in the process backend, the
// whole root). A process of session A could plant a symlink there — as the
// last component (/sessions/A/mnt/work -> /sessions/B) or one before it
// (/sessions/A/mnt -> /sessions/B/mnt) — or swap a directory for one while
// the agent works, so that a mount meant for A lands in B's home or over
// B's files. So no target is resolved by its path string:
//
//   - It is walked one component at a time from a root descriptor the agent
//     trusts (its own root, or the new root it builds before any process
//     runs), each component opened beneath the descriptor of the one before
//     with the confined open (beneath.OpenAt: openat2
//     RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS).
//     A missing directory is made with mkdirat, a missing file with openat
//     O_CREAT|O_EXCL, in the directory descriptor already held.
//   - A symlink (or /proc magic link) at any component is an error naming
//     that component (walkError), never followed; so is one swapped in
//     between making a component and opening it.
//   - The mount is made onto the final O_PATH descriptor (move_mount
//     MOVE_MOUNT_T_EMPTY_PATH, or mount(2) and umount2 on its
//     /proc/self/fd path), so nothing done to the path after the walk can
//     redirect it. A directory renamed away meanwhile takes the mount along,
//     but a rename cannot leave its mount (EXDEV): the mount stays in the
//     tree it was walked in.
//
// Mount points are walked as the helper names them: a host symlink inside
// a read-only system directory (/usr/local -> ../var/usrlocal) is refused
// as well.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
)

// noMkdir makes walkDir make no missing directory.
const noMkdir = 0

// mountPoint is a mount target held open with O_PATH.
type mountPoint struct {
	fd   int
	path string // as the helper (or the agent) named it, for messages
}

func (p mountPoint) close() { unix.Close(p.fd) }

// procPath names the held target for the calls that take a path
// (mount(2), umount2): its /proc/self/fd magic link.
func (p mountPoint) procPath() string { return fmt.Sprintf("/proc/self/fd/%d", p.fd) }

// openRoot opens dir, a directory the agent trusts (its root "/", or the
// new root it builds), as the root mount points are walked beneath.
func openRoot(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening %s to resolve mount points beneath: %w", dir, err)
	}
	return fd, nil
}

// withRoot runs fn with the agent's root "/" open.
func withRoot(fn func(root int) error) error {
	root, err := openRoot("/")
	if err != nil {
		return err
	}
	defer unix.Close(root)
	return fn(root)
}

// openComponent opens name, one entry of the held directory dir, with
// O_PATH and flags: the confined open (beneath.OpenAt), no symlink, no
// magic link, nothing outside dir.
func openComponent(dir int, name string, flags uint64) (int, error) {
	return beneath.OpenEntryAt(dir, name, unix.OpenHow{Flags: flags | unix.O_PATH})
}

// components splits p (absolute, clean) into its names; "/" has none.
func components(p string) []string {
	rel := strings.TrimPrefix(p, "/")
	if rel == "" {
		return nil
	}
	return strings.Split(rel, "/")
}

// readOnlyDirError: the directory dir is on a read-only mount, so the
// entry a walk had to make in it could not be made.
type readOnlyDirError struct {
	dir string
	err error
}

func (e *readOnlyDirError) Error() string { return e.dir + " is read-only: " + e.err.Error() }
func (e *readOnlyDirError) Unwrap() error { return e.err }

// walkError says why the walk to target stopped at the component at (in
// the directory parent).
func walkError(target, at, parent string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("mount point %s: %s is a symbolic link, which the agent does not follow in a mount point: %w", target, at, err)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("mount point %s: %s leads out of the directory it is walked beneath: %w", target, at, err)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("mount point %s: %s is not a directory: %w", target, at, err)
	case errors.Is(err, unix.EROFS):
		return fmt.Errorf("mount point %s: %w", target, &readOnlyDirError{dir: parent, err: err})
	}
	return fmt.Errorf("mount point %s: %s: %w", target, at, err)
}

// walkDir opens the directory p (absolute, clean, as seen from root)
// beneath root, one component at a time, making a missing directory with
// mode mkdirPerm (less the umask) unless mkdirPerm is noMkdir.
func walkDir(root int, p string, mkdirPerm uint32) (mountPoint, error) {
	fd, err := unix.FcntlInt(uintptr(root), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return mountPoint{}, fmt.Errorf("mount point %s: %w", p, err)
	}
	at := ""
	for _, name := range components(p) {
		parent := at
		if parent == "" {
			parent = "/"
		}
		at += "/" + name
		next, err := openComponent(fd, name, unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) && mkdirPerm != noMkdir {
			next, err = makeDir(fd, name, mkdirPerm)
		}
		unix.Close(fd)
		if err != nil {
			return mountPoint{}, walkError(p, at, parent, err)
		}
		fd = next
	}
	return mountPoint{fd: fd, path: p}, nil
}

// makeDir makes the directory name in dir and opens it; one made
// meanwhile by someone else is opened as it is (and refused if it is a
// symlink).
func makeDir(dir int, name string, perm uint32) (int, error) {
	if err := unix.Mkdirat(dir, name, perm); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return openComponent(dir, name, unix.O_DIRECTORY)
}

// lookupTarget opens the existing mount point p (a directory or a file)
// beneath root.
func lookupTarget(root int, p string) (mountPoint, error) {
	if p == "/" {
		return walkDir(root, p, noMkdir)
	}
	dir, err := walkDir(root, path.Dir(p), noMkdir)
	if err != nil {
		return mountPoint{}, err
	}
	defer dir.close()
	fd, err := openComponent(dir.fd, path.Base(p), 0)
	if err != nil {
		return mountPoint{}, walkError(p, p, dir.path, err)
	}
	return mountPoint{fd: fd, path: p}, nil
}

// detach unmounts (MNT_DETACH) what is mounted at the mount point p
// beneath root, and what is below it. A p already gone, or no mount point,
// is not an error.
func detach(root int, p string) error {
	mp, err := lookupTarget(root, p)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer mp.close()
	if err := unix.Unmount(mp.procPath(), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmounting %s: %w", p, err)
	}
	return nil
}

// maxDirCovers bounds how many read-only directories one file mount point
// may have covered on its way (makeDirWritable): the first one covered
// holds everything made below it.
const maxDirCovers = 2

// fileMountPoint returns the single-file mount point target beneath root,
// making it (an empty file) and its directories where missing. A
// read-only directory on the way (/usr/local/bin in a read-only /usr) is
// first covered by a writable copy of itself (makeDirWritable), so that
// the new entry can be made beside the others.
func fileMountPoint(root int, target string) (mountPoint, error) {
	for covers := 0; ; covers++ {
		mp, err := openFileTarget(root, target)
		var ro *readOnlyDirError
		if !errors.As(err, &ro) || covers == maxDirCovers {
			return mp, err
		}
		if err := makeDirWritable(root, ro.dir); err != nil {
			return mountPoint{}, err
		}
	}
}

// openFileTarget opens the regular file target beneath root, making it
// and its directories where missing.
func openFileTarget(root int, target string) (mountPoint, error) {
	dir, err := walkDir(root, path.Dir(target), 0o755)
	if err != nil {
		return mountPoint{}, err
	}
	defer dir.close()
	name := path.Base(target)
	fd, err := openComponent(dir.fd, name, 0)
	if errors.Is(err, unix.ENOENT) {
		fd, err = makeFile(dir.fd, name)
	}
	if err != nil {
		return mountPoint{}, walkError(target, target, dir.path, err)
	}
	mp := mountPoint{fd: fd, path: target}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		mp.close()
		return mountPoint{}, fmt.Errorf("mount point %s: %w", target, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		mp.close()
		return mountPoint{}, fmt.Errorf("mount point %s exists and is not a regular file", target)
	}
	return mp, nil
}

// makeFile makes the empty file name in dir and opens it; one made
// meanwhile is opened as it is (and refused if it is a symlink).
func makeFile(dir int, name string) (int, error) {
	fd, err := beneath.OpenEntryAt(dir, name, unix.OpenHow{Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_NOFOLLOW, Mode: 0o755})
	if err == nil {
		unix.Close(fd)
	} else if !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return openComponent(dir, name, 0)
}

// statTarget is fstat of the mount point p, walked beneath "/" as a mount
// is.
func statTarget(p string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := withRoot(func(root int) error {
		mp, err := lookupTarget(root, p)
		if err != nil {
			return err
		}
		defer mp.close()
		return unix.Fstat(mp.fd, &st)
	})
	return st, err
}

// maxStagingNames bounds the names makeStagingDir tries.
const maxStagingNames = 64

// stagingPoint is a fresh mount point under stagingDir, held open.
type stagingPoint struct {
	mountPoint
	parent int // stagingDir, held
	name   string
}

// release closes the staging point, removing its directory if remove is
// set (a mount left on it keeps the directory).
func (s stagingPoint) release(remove bool) {
	s.close()
	if remove {
		_ = unix.Unlinkat(s.parent, s.name, unix.AT_REMOVEDIR)
	}
	unix.Close(s.parent)
}

// makeStagingDir makes a fresh private mount point under stagingDir (made
// first where missing).
func makeStagingDir() (stagingPoint, error) {
	root, err := openRoot("/")
	if err != nil {
		return stagingPoint{}, err
	}
	defer unix.Close(root)
	parent, err := walkDir(root, stagingDir, 0o700)
	if err != nil {
		return stagingPoint{}, fmt.Errorf("the agent's staging directory: %w", err)
	}
	for range maxStagingNames {
		name := fmt.Sprintf("m%08x", rand.Uint32())
		err := unix.Mkdirat(parent.fd, name, 0o700)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		var fd int
		if err == nil {
			if fd, err = openComponent(parent.fd, name, unix.O_DIRECTORY); err != nil {
				_ = unix.Unlinkat(parent.fd, name, unix.AT_REMOVEDIR)
			}
		}
		if err != nil {
			parent.close()
			return stagingPoint{}, fmt.Errorf("creating a staging mount point: %w", err)
		}
		return stagingPoint{mountPoint: mountPoint{fd: fd, path: stagingDir + "/" + name}, parent: parent.fd, name: name}, nil
	}
	parent.close()
	return stagingPoint{}, errors.New("creating a staging mount point: every name tried is taken")
}
