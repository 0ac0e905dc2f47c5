package helper

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
)

// skelDir is the host's home skeleton (mountSkeletonHome).
var skelDir = "/etc/skel"

// Bounds of a home skeleton's copy.
const (
	maxSkelEntries   = 256
	maxSkelFileBytes = 1 << 20
	maxSkelDepth     = 8
)

// copySkeleton copies the regular files and directories of skel into the
// session directory home, keeping what home has (never overwriting,
// never following a symlink: the session is guest-writable), modes without
// set-id bits, at most maxSkelEntries entries of at most maxSkelFileBytes.
// Both trees are walked by descriptor (package beneath).
func copySkeleton(skel, home string) error {
	// skel is the host's own, trusted: a symlink to it is followed, as
	// an open of its path would.
	skel, err := filepath.EvalSymlinks(skel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening the home skeleton: %w", err)
	}
	src, err := beneath.Open(skel)
	if err != nil {
		return err
	}
	dst, err := beneath.Open(home)
	if err != nil {
		src.Close()
		return fmt.Errorf("opening the session directory: %w", err)
	}
	left := maxSkelEntries
	return copySkelDir(src, dst, 0, &left)
}

// copySkelDir copies the entries of the directory src into dst and closes
// both.
func copySkelDir(src, dst *beneath.Dir, depth int, left *int) error {
	defer src.Close()
	defer dst.Close()
	entries, err := src.Entries(maxSkelEntries)
	errs := []error{err}
	for _, e := range entries {
		if *left--; *left < 0 {
			return errors.New("more than the entries a skeleton may have")
		}
		perm := e.Stat.Mode & 0o777
		switch e.Stat.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			errs = append(errs, copySkelFile(src, dst, e.Name, perm))
		case unix.S_IFDIR:
			if depth < maxSkelDepth {
				errs = append(errs, copySkelSubdir(src, dst, e.Name, perm, depth, left))
			}
		}
	}
	return errors.Join(errs...)
}

// copySkelSubdir copies the directory name of src into dst, into what dst
// has at name if that is a directory.
func copySkelSubdir(src, dst *beneath.Dir, name string, perm uint32, depth int, left *int) error {
	if err := dst.Mkdir(name, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	sub, err := src.OpenDir(name)
	if err != nil {
		return err
	}
	subDst, err := dst.OpenDir(name)
	if err != nil {
		sub.Close()
		return nil // not a directory in the home (a file, a symlink): left as it is
	}
	return copySkelDir(sub, subDst, depth+1, left)
}

// copySkelFile copies the regular file name of src to dst unless dst has
// that name.
func copySkelFile(src, dst *beneath.Dir, name string, perm uint32) error {
	in, _, err := src.OpenFile(name)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := dst.CreateFile(name, perm)
	if errors.Is(err, fs.ErrExist) {
		return nil // the home's own
	}
	if err != nil {
		return err
	}
	_, err = io.Copy(out, io.LimitReader(in, maxSkelFileBytes))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
