package agent

// /var on the root disk, and the package database (rootdisk.go's sequel).
//
// With a root disk the guest's /var is the disk's var/ directory, bound
// read-write: what programs keep there (caches, logs, /var/tmp, apt's and
// dpkg's state) survives the VM like the system directories' changes. The
// host's /var is never shared but for its package database: when the
// helper shares the host's /var/lib/dpkg (RootDisk.PackageDB), the guest's
// /var/lib/dpkg is an overlay of it with its upper layer on the disk, so
// dpkg (through sudo, sudo.go) knows what the host's /usr holds and what a
// session installed on top. Sessions write var/ directly, so everything
// below it is walked by descriptor, no symlink followed; the overlay's
// layers lie in the disk's upper/ and work/, which no session reaches.
//
// apt drops its privileges to the _apt user for downloads, which a sudo
// command (no CAP_SETUID) cannot: aptSandboxConf, written once into the
// writable /etc, tells apt to stay root instead.

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const (
	// varTarget is the guest's /var; packageDBTarget its dpkg database.
	varTarget       = "/var"
	packageDBTarget = "/var/lib/dpkg"
	// packageDBLower is where the host's package database is bound, out
	// of sight, as the overlay's lower layer.
	packageDBLower = stagingDir + "/package-db"
	// aptSandboxConf and aptSandboxText: apt's setting for sudo.
	aptSandboxConf = "/etc/apt/apt.conf.d/00cowork-vmm-sudo"
	aptSandboxText = "// Written by cowork-vmm's guest agent. sudo here is root of a user namespace\n" +
		"// without CAP_SETUID, so apt cannot switch to _apt: it stays root.\n" +
		"APT::Sandbox::User \"root\";\n"
)

// varSkeleton are the directories /var starts with (and gets back if
// removed), with their modes.
var varSkeleton = []struct {
	dir  string
	mode uint32
}{
	{"tmp", 0o1777}, {"cache", 0o755}, {"cache/apt/archives/partial", 0o755}, {"lib", 0o755},
	{"lib/apt/lists/partial", 0o755}, {"lib/dpkg", 0o755}, {"log", 0o755}, {"log/apt", 0o755},
}

// packageDBLocks are dpkg's lock files, made empty in the database's upper
// layer: the host's are root's and unreadable to a helper that is not, so
// overlayfs could not copy them up.
var packageDBLocks = []string{"lock", "lock-frontend", "triggers/Lock"}

// setUpVar binds the disk's var/ at /var and overlays the host's package
// database (pkgdb, nil: none shared) at /var/lib/dpkg; timer takes each
// step's time.
func (m *mounter) setUpVar(disk string, pkgdb *protocol.MountSource, timer *stepTimer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	diskFD, err := openRoot(disk)
	if err != nil {
		return err
	}
	defer unix.Close(diskFD)
	varDir, err := walkDir(diskFD, varTarget, 0o755)
	if err != nil {
		return fmt.Errorf("the root disk's var: %w", err)
	}
	defer varDir.close()
	if err := makeSkeleton(varDir.fd); err != nil {
		return err
	}
	err = withRoot(func(root int) error {
		dst, err := walkDir(root, varTarget, 0o755)
		if err != nil {
			return err
		}
		defer dst.close()
		return bindFrom(varDir.fd, dst, false, "the root disk's var")
	})
	if err != nil {
		return err
	}
	m.system = append(m.system, varTarget)
	timer.done("root_disk.var")
	if pkgdb == nil {
		return nil
	}
	if err := validateDeviceSource(*pkgdb); err != nil {
		return fmt.Errorf("the package database: %w", err)
	}
	err = m.overlayPackageDB(disk, *pkgdb)
	timer.done("root_disk.package_db")
	return err
}

// makeSkeleton makes varSkeleton's directories beneath dir, no symlink
// followed, and gives each its mode.
func makeSkeleton(dir int) error {
	for _, d := range varSkeleton {
		p, err := walkDir(dir, "/"+d.dir, 0o755)
		if err != nil {
			return fmt.Errorf("/var/%s on the root disk: %w", d.dir, err)
		}
		err = chmodHeld(p, d.mode)
		p.close()
		if err != nil {
			return fmt.Errorf("/var/%s on the root disk: %w", d.dir, err)
		}
	}
	return nil
}

// inUpperLayer says whether the disk's upper layer holds an entry for the
// system path p (a file, or a whiteout), found by descriptor with no
// symlink followed.
func inUpperLayer(disk, p string) bool {
	upper, err := unix.Open(upperLayer(disk, "/"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(upper)
	fd, err := beneath.OpenAt(upper, strings.TrimPrefix(p, "/"), unix.OpenHow{Flags: unix.O_PATH})
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// chmodHeld sets the mode of the directory p holds (O_PATH descriptors
// cannot be fchmod'ed: it is reopened through /proc/self/fd). A directory
// that has the mode already is left alone: at each start the skeleton is
// there, and a chmod would still write its inode (ctime) to the disk.
func chmodHeld(p mountPoint, mode uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(p.fd, &st); err != nil {
		return err
	}
	if st.Mode&0o7777 == mode {
		return nil
	}
	fd, err := unix.Open(p.procPath(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, mode)
}

// overlayPackageDB mounts the overlay of the host's package database
// (pkgdb) onto /var/lib/dpkg, its upper layer and work directory in the
// disk's upper/ and work/. The caller holds m.mu.
func (m *mounter) overlayPackageDB(disk string, pkgdb protocol.MountSource) error {
	src, err := m.deviceExport(pkgdb, "")
	if err != nil {
		return err
	}
	defer unix.Close(src)
	if err := os.MkdirAll(packageDBLower, 0o700); err != nil {
		return fmt.Errorf("the package database's mount point: %w", err)
	}
	lower, err := openRoot(packageDBLower)
	if err != nil {
		return err
	}
	err = bindFrom(src, mountPoint{fd: lower, path: packageDBLower}, true, "the host's package database")
	unix.Close(lower)
	if err != nil {
		return err
	}
	opts, err := overlayLayers(disk, packageDBTarget, packageDBLower)
	if err != nil {
		return err
	}
	upper := upperLayer(disk, packageDBTarget)
	if err := os.MkdirAll(path.Join(upper, "triggers"), 0o755); err != nil {
		return fmt.Errorf("the package database's overlay: %w", err)
	}
	for _, name := range packageDBLocks {
		fd, err := unix.Open(path.Join(upper, name), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o640)
		if err == nil {
			unix.Close(fd)
		} else if !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("dpkg's %s: %w", name, err)
		}
	}
	return withRoot(func(root int) error {
		dst, err := walkDir(root, packageDBTarget, 0o755)
		if err != nil {
			return err
		}
		defer dst.close()
		if err := unix.Mount("overlay", dst.procPath(), "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("the overlay of %s: %w", packageDBTarget, err)
		}
		return nil
	})
}

// writeAptSandboxConf writes aptSandboxConf when the guest has apt and no
// such file yet; the writable /etc is walked without following symlinks.
// Once written (or removed by a session: a whiteout), the name is in the
// disk's upper layer, where it is looked for first: a start then costs one
// lookup on the disk, not a walk through the overlay and the host's /etc.
func writeAptSandboxConf(disk string) error {
	if inUpperLayer(disk, aptSandboxConf) {
		return nil
	}
	return withRoot(func(root int) error {
		dir, err := walkDir(root, path.Dir(aptSandboxConf), noMkdir)
		if errors.Is(err, unix.ENOENT) {
			return nil // no apt here
		}
		if err != nil {
			return err
		}
		defer dir.close()
		fd, err := beneath.OpenEntryAt(dir.fd, path.Base(aptSandboxConf), unix.OpenHow{Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW, Mode: 0o644})
		if errors.Is(err, unix.EEXIST) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", aptSandboxConf, err)
		}
		f := os.NewFile(uintptr(fd), aptSandboxConf)
		_, err = f.WriteString(aptSandboxText)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
}
