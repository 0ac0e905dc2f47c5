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
//	var/          the guest's /var (rootvar.go); upper/var/lib/dpkg and
//	              work/var/lib/dpkg, the overlay of the host's dpkg database

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const (
	// rootDiskDir is where the agent mounts the root disk.
	rootDiskDir = stagingDir + "/rootdisk"
	// An ext2/3/4 superblock: where it lies on the device, the part of it
	// probeDisk reads, its magic (at 0x38) and the 64bit feature
	// (s_feature_incompat, at 0x60: s_blocks_count_hi at 0x150 counts).
	ext4SuperblockOffset = 1024
	ext4SuperblockSize   = 0x154
	ext4Magic            = 0xEF53
	ext4Incompat64Bit    = 0x80
	// formatTimeout bounds mke2fs.
	formatTimeout = 2 * time.Minute
	// ext4IocResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): grow a
	// mounted ext4 to a block count.
	ext4IocResizeFS = 0x40086610
	// ext4IocCheckpoint is EXT4_IOC_CHECKPOINT, _IOW('f', 43, __u32)
	// (Linux 5.13): commit the journal, write its blocks home and mark it
	// empty. Flags 0: no discard or zeroing of the journal's blocks.
	ext4IocCheckpoint = 0x4004662b
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
	sb, err := probeDisk(dev)
	if err != nil {
		return "", err
	}
	timer.done("root_disk.probe")
	if !sb.formatted {
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
	if sb.formatted && sb.blocksShort() > 0 {
		if err := growFS(rootDiskDir, sb.diskBlocks()); err != nil {
			a.log.Warn("the root disk's file system was not grown to the disk", "err", err)
		}
		timer.done("root_disk.grow")
	}
	a.mnt.mu.Lock()
	a.mnt.syncDirs = append(a.mnt.syncDirs, rootDiskDir)
	a.mnt.mu.Unlock()
	if err := a.mnt.overlaySystem(rootDiskDir, timer); err != nil {
		return did, err
	}
	if err := a.mnt.setUpVar(rootDiskDir, disk.PackageDB, timer); err != nil {
		a.log.Warn("/var is not on the root disk", "err", err)
	}
	if err := writeAptSandboxConf(rootDiskDir); err != nil {
		a.log.Warn("apt may try to drop privileges sudo does not have", "err", err)
	}
	timer.done("root_disk.apt_conf")
	if !a.mnt.isolate {
		return did, nil
	}
	if err := a.mnt.startSessionTmp(rootDiskDir); err != nil {
		a.log.Warn("sessions' /tmp stays in guest RAM", "err", err)
	}
	timer.done("root_disk.session_tmp")
	return did, nil
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

// diskSuperblock is what probeDisk read of a disk.
type diskSuperblock struct {
	formatted bool   // it holds an ext2/3/4 file system
	blocks    uint64 // the file system's size in blocks (formatted)
	blockSize uint64 // (formatted)
	diskBytes uint64 // the disk's size
}

// diskBlocks is how many of the file system's blocks the disk holds.
func (sb diskSuperblock) diskBlocks() uint64 { return sb.diskBytes / sb.blockSize }

// blocksShort is how many blocks the file system lacks to fill the disk
// (createVM grew it); 0 when it fills it.
func (sb diskSuperblock) blocksShort() uint64 {
	if !sb.formatted || sb.diskBlocks() <= sb.blocks {
		return 0
	}
	return sb.diskBlocks() - sb.blocks
}

// probeDisk reads dev's size and its ext2/3/4 superblock, if it has one.
// The disk's cached blocks are dropped first: a guest restored from a
// snapshot holds what the kernel read of the disk when the snapshot was
// taken (its partition scan at boot), which may since have been formatted.
func probeDisk(dev string) (diskSuperblock, error) {
	var sb diskSuperblock
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return sb, fmt.Errorf("opening the root disk: %w", err)
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKFLSBUF, 0); errno != 0 {
		return sb, fmt.Errorf("dropping the root disk's cached blocks: %w", errno)
	}
	if sb.diskBytes, err = unix.IoctlGetUint64(fd, unix.BLKGETSIZE64); err != nil {
		return sb, fmt.Errorf("the root disk's size: %w", err)
	}
	raw := make([]byte, ext4SuperblockSize)
	if _, err := unix.Pread(fd, raw, ext4SuperblockOffset); err != nil {
		return sb, fmt.Errorf("reading the root disk's superblock: %w", err)
	}
	return parseExt4Superblock(raw, sb.diskBytes), nil
}

// parseExt4Superblock reads the fields probeDisk needs of an ext2/3/4
// superblock (raw: its first ext4SuperblockSize bytes) on a disk of
// diskBytes. Anything that is not a plausible one reads as unformatted:
// the disk is formatted afresh.
func parseExt4Superblock(raw []byte, diskBytes uint64) diskSuperblock {
	sb := diskSuperblock{diskBytes: diskBytes}
	le := binary.LittleEndian
	if len(raw) < ext4SuperblockSize || le.Uint16(raw[0x38:]) != ext4Magic {
		return sb
	}
	logSize := le.Uint32(raw[0x18:])
	if logSize > 6 { // ext4 blocks are 1 KiB to 64 KiB
		return sb
	}
	sb.blockSize = 1024 << logSize
	sb.blocks = uint64(le.Uint32(raw[0x04:]))
	if le.Uint32(raw[0x60:])&ext4Incompat64Bit != 0 {
		sb.blocks |= uint64(le.Uint32(raw[0x150:])) << 32
	}
	sb.formatted = true
	return sb
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

// growFS grows the ext4 file system mounted at dir to blocks blocks, the
// disk's size (createVM asked for a larger disk), online.
func growFS(dir string, blocks uint64) error {
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

// syncRootDisk makes what was written to the root disk, or to the
// bundle's images, durable (syncfs: the journal committed, the disk
// flushed), so that a shutdown loses nothing: the helper stops the VM
// once the agent has answered. It then empties each journal
// (checkpointJournal). Without a writable disk it does nothing.
func (m *mounter) syncRootDisk() error {
	m.mu.Lock()
	dirs := slices.Clone(m.syncDirs)
	m.mu.Unlock()
	var errs []error
	for _, dir := range dirs {
		if err := m.syncDisk(dir); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// syncDisk syncs the file system mounted at dir and checkpoints its
// journal (syncRootDisk).
func (m *mounter) syncDisk(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return err
	}
	if err := checkpointJournal(fd); err != nil {
		m.log.Warn("the disk's next mount replays its journal", "disk", dir, "err", err)
	}
	return nil
}

// checkpointJournal writes every block of the ext4 journal of the file
// system open at fd to its home and marks the journal empty, so that the
// next mount has nothing to replay. The disk is never unmounted (the VM
// powers off), so without this each start replayed the journal of the
// session before: nested, the mount took 420–940 ms with the replay and
// 150 ms without. What the journal holds is already durable (syncfs), so
// a failure here costs only that replay.
func checkpointJournal(fd int) error {
	if err := unix.IoctlSetPointerInt(fd, ext4IocCheckpoint, 0); err != nil {
		return fmt.Errorf("checkpointing the journal: %w", err)
	}
	return nil
}

// upperLayer is where the overlay of the system path target keeps its
// upper layer on the disk mounted at disk.
func upperLayer(disk, target string) string { return path.Join(disk, "upper", target) }

// overlayLayers makes the upper layer and work directory of target's
// overlay on the disk and returns overlayfs's mount options for them over
// the lower layer lower.
func overlayLayers(disk, target, lower string) (string, error) {
	if strings.ContainsAny(target+lower, ",:\\") {
		return "", fmt.Errorf("cannot overlay %s: overlayfs options cannot name it", target)
	}
	upper, work := upperLayer(disk, target), path.Join(disk, "work", target)
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("the overlay of %s: %w", target, err)
		}
	}
	return "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work, nil
}

// overlayOnto mounts an overlay at target whose lower layer is what is
// mounted there now.
func overlayOnto(target, disk string) error {
	opts, err := overlayLayers(disk, target, target)
	if err != nil {
		return err
	}
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("the overlay of %s: %w", target, err)
	}
	return nil
}
