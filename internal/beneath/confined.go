package beneath

import (
	"errors"
	"strings"

	"golang.org/x/sys/unix"
)

// Confined is the resolution of every confined open: beneath the held
// directory (no absolute path, no ".." out of it), no symlink at any
// component and no /proc magic link. Callers add RESOLVE_NO_XDEV to stay
// on the held directory's mount too.
const Confined = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// maxRenameRetries bounds the retries of one openat2 that failed with
// EAGAIN: a rename elsewhere on the filesystem while it resolved (which a
// guest can repeat forever).
const maxRenameRetries = 16

// OpenAt is the one confined open: openat2 of rel (a relative path,
// several components allowed) beneath the directory descriptor dir, with
// how.Flags plus O_CLOEXEC, how.Mode (for O_CREAT) and how.Resolve plus
// Confined. A symlink at any component fails with ELOOP (as the last
// component: ENOTDIR with O_DIRECTORY|O_NOFOLLOW, and O_PATH|O_NOFOLLOW
// opens the symlink itself); a way out of dir fails with EXDEV. An
// interrupted call is made again, as is one a concurrent rename made fail
// (EAGAIN, at most maxRenameRetries times). An empty or absolute rel
// fails with ErrBadName. On a kernel without openat2 (before 5.6) a
// single component (no '/', not "..") is opened with openat and
// O_NOFOLLOW, which cannot leave dir either; a longer path fails with
// ENOSYS. The caller closes the descriptor.
func OpenAt(dir int, rel string, how unix.OpenHow) (int, error) {
	if rel == "" || rel[0] == '/' {
		return -1, ErrBadName
	}
	how.Flags |= unix.O_CLOEXEC
	how.Resolve |= Confined
	for renames := 0; ; {
		h := how
		fd, err := unix.Openat2(dir, rel, &h)
		switch {
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EAGAIN) && renames < maxRenameRetries:
			renames++
		case errors.Is(err, unix.ENOSYS) && isOneComponent(rel):
			return openatNoFollow(dir, rel, how)
		default:
			return fd, err
		}
	}
}

// isOneComponent says whether rel names dir itself or one entry of it:
// what openat with O_NOFOLLOW resolves without leaving dir.
func isOneComponent(rel string) bool {
	return rel != ".." && !strings.Contains(rel, "/")
}

// openatNoFollow is OpenAt's fallback where openat2 is missing: openat of
// one component with O_NOFOLLOW, made again when interrupted.
func openatNoFollow(dir int, name string, how unix.OpenHow) (int, error) {
	for {
		fd, err := unix.Openat(dir, name, int(how.Flags)|unix.O_NOFOLLOW, uint32(how.Mode))
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

// OpenEntryAt is OpenAt of name, a single entry of dir: a name with a
// '/', "", "." and ".." fail with ErrBadName.
func OpenEntryAt(dir int, name string, how unix.OpenHow) (int, error) {
	if err := checkName(name); err != nil {
		return -1, err
	}
	return OpenAt(dir, name, how)
}
