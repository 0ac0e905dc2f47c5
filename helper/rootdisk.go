package helper

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The profile's root disk (issue #19): a sparse raw image in the profile's
// directory, profiles/<id>/root.img, which a VM guest keeps its changes to
// the root on (the agent's rootdisk.go). createVM's diskSizeGB sizes it (a
// larger size grows it at the next start; it never shrinks, which would
// cut the guest's file system); without one it is DefaultRootDiskBytes.
// Removing the file starts the next guest on a clean root. The host never
// reads what is in it: the guest formats and mounts it.

const (
	rootDiskFile = "root.img"
	// DefaultRootDiskBytes sizes a root disk createVM gave no size for.
	// Sparse: only what the guest writes takes host disk space.
	DefaultRootDiskBytes = 16 << 30
	// minRootDiskBytes is the smallest disk worth formatting.
	minRootDiskBytes = 64 << 20
	// rootDiskEnv set to "off" starts guests without a root disk (their
	// root read-only, as before the disk existed).
	rootDiskEnv = "COWORK_VMM_ROOTDISK"
)

// rootDiskPath returns where the profile's root disk lives; "" when the
// helper keeps no state or root disks are off.
func (s *Service) rootDiskPath() string {
	if s.opts.Stateless || s.opts.DataDir == "" || strings.EqualFold(os.Getenv(rootDiskEnv), "off") {
		return ""
	}
	return filepath.Join(s.opts.DataDir, profilesDirName, profileID(s.key), rootDiskFile)
}

// prepareRootDisk makes the root disk at path exist with at least size
// bytes (rounded up to a whole MiB), creating or growing the sparse file.
func prepareRootDisk(path string, size int64) error {
	size = max(size, minRootDiskBytes)
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("the root disk's directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("the root disk %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("the root disk %s is not a regular file", path)
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
// prepared at the size createVM asked for; "" for none (the process
// backend, no state, turned off, or a disk that could not be made: logged).
func (s *Service) rootDiskFor(backend Backend) string {
	path := s.rootDiskPath()
	if path == "" || backend.Name() == BackendProcess {
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
