package agent

// The writable root (SetupParams.RootDisk: the VM).
//
// The guest's system directories are the host's, read-only. With a root
// disk — a virtio-blk disk of the profile's own, a sparse file on the host
// — each of them becomes an overlay: the host's directory the lower layer,
// a directory on the disk the upper one. What a session installs (pip,
// npm -g, a file in /opt) lands on the disk and is there at the next start;
// the host's directories are never written. The disk is formatted ext4 by
// the guest itself the first time (the host's mke2fs, run in the guest
// through the shared /usr): the host never parses what the guest writes
// there. It is mounted in the agent's private staging directory, out of
// sight of the spawns, which see only the overlays.
//
// Layout of the disk:
//
//	upper/<dir>   the upper layer of system directory <dir> (upper/usr, …)
//	work/<dir>    its overlayfs work directory

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const (
	// rootDiskDir is where the agent mounts the root disk.
	rootDiskDir = stagingDir + "/rootdisk"
	// ext4MagicOffset is where an ext2/3/4 superblock's magic (0xEF53,
	// little-endian) lies on the device.
	ext4MagicOffset = 1024 + 0x38
	// formatTimeout bounds mke2fs.
	formatTimeout = 2 * time.Minute
	// ext4IocResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): grow a
	// mounted ext4 to a block count.
	ext4IocResizeFS = 0x40086610
	// rootDiskMountData are the disk's ext4 mount options. noinit_itable:
	// no background zeroing of the inode tables mke2fs left uninitialised
	// (lazy_itable_init). The disk is a sparse file whose holes already
	// read as zeros, so the zeroing would only turn up to a few hundred MiB
	// of holes into written blocks on the host and compete with the
	// session for the guest's vCPU and the disk.
	rootDiskMountData = "noinit_itable"
)

// mke2fsPaths are where the host's userland keeps mke2fs.
var mke2fsPaths = []string{"/usr/sbin/mke2fs", "/sbin/mke2fs", "/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"}

// setUpRootDisk finds the disk disk names, formats it when it holds no
// ext4 file system, mounts it and overlays the system mounts on it. It
// says what it did; an error leaves the root read-only, as without a disk.
// Each step is timed (root_disk.*) for the helper's set-up breakdown.
func (a *agent) setUpRootDisk(disk protocol.RootDisk, timer *stepTimer) (string, error) {
	dev, err := findDisk(disk.Serial)
	if err != nil {
		return "", err
	}
	did := "mounted"
	formatted, err := hasExt4(dev)
	if err != nil {
		return "", err
	}
	timer.done("root_disk.probe")
	if !formatted {
		if err := a.formatDisk(dev); err != nil {
			return "", err
		}
		did = "formatted and mounted"
		timer.done("root_disk.format")
	}
	if err := os.MkdirAll(rootDiskDir, 0o700); err != nil {
		return "", err
	}
	if err := unix.Mount(dev, rootDiskDir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, rootDiskMountData); err != nil {
		return "", fmt.Errorf("mounting the root disk %s: %w", dev, err)
	}
	timer.done("root_disk.mount")
	if err := growFS(dev, rootDiskDir); err != nil {
		a.log.Warn("the root disk's file system was not grown to the disk", "err", err)
	}
	timer.done("root_disk.grow")
	return did, a.mnt.overlaySystem(rootDiskDir, timer)
}

// findDisk returns the device node of the virtio-blk disk whose serial is
// serial.
func findDisk(serial string) (string, error) {
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return "", fmt.Errorf("listing the guest's disks: %w", err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "vd") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
		if err == nil && strings.TrimSpace(string(b)) == serial {
			return "/dev/" + e.Name(), nil
		}
	}
	return "", fmt.Errorf("the guest has no virtio disk with serial %q", serial)
}

// hasExt4 reports whether dev holds an ext2/3/4 file system. The disk's
// cached blocks are dropped first: a guest restored from a snapshot holds
// what the kernel read of the disk when the snapshot was taken (its
// partition scan at boot), which may since have been formatted.
func hasExt4(dev string) (bool, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("opening the root disk: %w", err)
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKFLSBUF, 0); errno != 0 {
		return false, fmt.Errorf("dropping the root disk's cached blocks: %w", errno)
	}
	magic := make([]byte, 2)
	if _, err := unix.Pread(fd, magic, ext4MagicOffset); err != nil {
		return false, fmt.Errorf("reading the root disk's superblock: %w", err)
	}
	return magic[0] == 0x53 && magic[1] == 0xEF, nil
}

// formatDisk makes an ext4 file system on dev with the host's mke2fs.
// Lazy initialisation leaves the inode tables and journal to the kernel,
// and no discard: the sparse disk is all holes already.
func (a *agent) formatDisk(dev string) error {
	tool := ""
	for _, p := range mke2fsPaths {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			tool = p
			break
		}
	}
	if tool == "" {
		return fmt.Errorf("the root disk is blank and there is no mke2fs to format it (looked at %s; install e2fsprogs on the host)", strings.Join(mke2fsPaths, ", "))
	}
	a.log.Info("formatting the root disk", "device", dev, "tool", tool)
	return a.procs.runTool(formatTimeout, tool, "-q", "-F", "-t", "ext4", "-L", "cowork-root", "-m", "0",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", dev)
}

// growFS grows the ext4 file system mounted at dir to the size of dev
// (createVM asked for a larger disk), online.
func growFS(dev, dir string) error {
	devFD, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	size, err := unix.IoctlGetUint64(devFD, unix.BLKGETSIZE64)
	unix.Close(devFD)
	if err != nil {
		return fmt.Errorf("the root disk's size: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	if st.Bsize <= 0 {
		return errors.New("the root disk's file system reports no block size")
	}
	blocks := size / uint64(st.Bsize)
	if blocks <= st.Blocks {
		return nil
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), ext4IocResizeFS, uintptr(unsafe.Pointer(&blocks))); errno != 0 {
		return fmt.Errorf("resizing to %d blocks: %w", blocks, errno)
	}
	return nil
}

// overlaySystem lays a writable overlay over every system mount (not the
// symlinks), its upper layer and work directory below disk.
func (m *mounter) overlaySystem(disk string, timer *stepTimer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, target := range m.system {
		mt, ok := m.mounts[target]
		if !ok || mt.Source.Kind == protocol.MountKindSymlink || mt.SourceFile != "" {
			continue
		}
		if err := overlayOnto(target, disk); err != nil {
			return err
		}
		m.overlaid = true
		timer.done("root_disk.overlay:" + target)
	}
	return nil
}

// syncRootDisk makes what was written to the root disk durable (syncfs:
// the journal committed, the disk flushed), so that a shutdown loses
// nothing: the helper stops the VM once the agent has answered. Without a
// root disk it does nothing.
func (m *mounter) syncRootDisk() error {
	m.mu.Lock()
	overlaid := m.overlaid
	m.mu.Unlock()
	if !overlaid {
		return nil
	}
	fd, err := unix.Open(rootDiskDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// overlayOnto mounts an overlay at target whose lower layer is what is
// mounted there now.
func overlayOnto(target, disk string) error {
	if strings.ContainsAny(target, ",:\\") {
		return fmt.Errorf("cannot overlay %s: overlayfs options cannot name it", target)
	}
	upper, work := path.Join(disk, "upper", target), path.Join(disk, "work", target)
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("the overlay of %s: %w", target, err)
		}
	}
	opts := "lowerdir=" + target + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("the overlay of %s: %w", target, err)
	}
	return nil
}
