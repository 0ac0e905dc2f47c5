package helper

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The profile's root disk (issue #19): a sparse raw image in the profile's
// directory, profiles/<id>/root.img, which a VM guest keeps its changes to
// the root on (the agent's rootdisk.go). createVM's diskSizeGB sizes it (a
// larger size grows it at the next start; it never shrinks, which would
// cut the guest's file system); without one it is DefaultRootDiskBytes.
// Removing the file (`cowork-vmm doctor --reset-root`) starts the next
// guest on a clean root. The host never reads what is in it: the guest
// formats and mounts it.
//
// Whoever opens the image for a VM holds an exclusive flock on it for as
// long as it stays open (OpenRootDisk, LockRootDisk): two guests writing
// one ext4 image would corrupt it, so a second helper of the profile (or a
// second VM) starts without the disk instead. Doctor takes the same lock,
// briefly, to tell a disk in use.

const (
	// RootDiskFile is the root disk's name in its profile's directory.
	RootDiskFile = "root.img"
	// ProfilesDir is the data directory's directory of profiles: a root
	// disk is <DataDir>/ProfilesDir/<profile id>/RootDiskFile.
	ProfilesDir = profilesDirName
	// DefaultRootDiskBytes sizes a root disk createVM gave no size for.
	// Sparse: only what the guest writes takes host disk space.
	DefaultRootDiskBytes = 16 << 30
	// minRootDiskBytes is the smallest disk worth formatting.
	minRootDiskBytes = 64 << 20
	// RootDiskEnv set to "off" starts guests without a root disk (their
	// root read-only, as before the disk existed).
	RootDiskEnv = "COWORK_VMM_ROOTDISK"
)

// ErrRootDiskInUse: another open of the root disk holds its lock (a VM
// runs on it).
var ErrRootDiskInUse = errors.New("in use by a running VM")

// rootDiskPath returns where the profile's root disk lives; "" when the
// helper keeps no state or root disks are off.
func (s *Service) rootDiskPath() string {
	if s.opts.Stateless || s.opts.DataDir == "" || strings.EqualFold(os.Getenv(RootDiskEnv), "off") {
		return ""
	}
	return filepath.Join(s.opts.DataDir, profilesDirName, profileID(s.key), RootDiskFile)
}

// profileDir returns the profile's directory in the data directory, where
// its root disk and a backend's layers over the client's bundle live; ""
// when the helper keeps no state.
func (s *Service) profileDir() string {
	if s.opts.Stateless || s.opts.DataDir == "" {
		return ""
	}
	return filepath.Join(s.opts.DataDir, profilesDirName, profileID(s.key))
}

// OpenRootDisk opens the root disk at path for a VM, for reading and
// writing, locked (LockRootDisk) for as long as the file stays open. A
// symlink is not followed; what is not a regular file is refused.
func OpenRootDisk(path string) (*os.File, error) {
	return openRootDisk(path, 0)
}

// openRootDisk is OpenRootDisk with extra open flags (O_CREATE).
func openRootDisk(path string, flag int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC|flag, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the root disk: %w", err)
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("the root disk %s is not a regular file", path)
	}
	if err == nil {
		err = LockRootDisk(f)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// LockRootDisk takes the root disk's lock on f, an open of the image:
// flock, exclusive, without waiting. flock, not fcntl: its lock belongs to
// the open file, so it lasts exactly as long as f stays open, and a second
// open in the same process conflicts too. A disk locked already fails with
// ErrRootDiskInUse, naming the file.
func LockRootDisk(f *os.File) error {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	for errors.Is(err, unix.EINTR) {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	switch {
	case errors.Is(err, unix.EWOULDBLOCK):
		return fmt.Errorf("the root disk %s is %w (another helper of this profile has it open)", f.Name(), ErrRootDiskInUse)
	case err != nil:
		return fmt.Errorf("locking the root disk %s: %w", f.Name(), err)
	}
	return nil
}

// prepareRootDisk makes the root disk at path exist with at least size
// bytes (rounded up to a whole MiB), creating or growing the sparse file;
// a disk in use is refused (ErrRootDiskInUse) rather than resized under
// its VM.
func prepareRootDisk(path string, size int64) error {
	size = max(size, minRootDiskBytes)
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("the root disk's directory: %w", err)
	}
	f, err := openRootDisk(path, os.O_CREATE)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() >= size {
		return nil
	}
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("sizing the root disk %s to %d bytes: %w", path, size, err)
	}
	return f.Sync()
}

// rootDiskFor returns the root disk a guest of backend starts with,
// prepared at the size createVM asked for; "" for none (a backend that
// attaches none, no state, turned off, or a disk that could not be made:
// logged).
func (s *Service) rootDiskFor(backend Backend) string {
	path := s.rootDiskPath()
	if a, ok := backend.(RootDiskAttacher); path == "" || !ok || !a.AttachesRootDisk() {
		return ""
	}
	s.mu.Lock()
	size := s.diskQuota
	s.mu.Unlock()
	if size <= 0 {
		size = DefaultRootDiskBytes
	}
	if err := prepareRootDisk(path, size); err != nil {
		s.log.Warn("the guest starts without a root disk: its root is read-only", "err", err)
		return ""
	}
	return path
}
