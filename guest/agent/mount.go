package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/readahead"
	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Guest paths the agent reserves.
const (
	// stagingDir holds short-lived mount points (9p file mounts, the
	// writable copy of a read-only directory). Only the agent uses it.
	stagingDir = "/.cowork-agent"
	// hostRootDir is where, after a NewRoot setup, the old (host) root stays
	// mounted so that later bind mounts can reach host paths. It is covered
	// by an empty read-only tmpfs, and spawned processes run in a nested
	// user namespace where that cover is locked: they see an empty directory.
	hostRootDir = "/.host"
)

// Shared-filesystem devices. In the VM every host share is an export of a
// virtio-fs device (protocol.MountKindVirtioFS) or, with COWORK_VMM_FS=9p,
// of a virtio-9p device (MountKindNineP): a directory named by its aname in
// the root of the device's tree. Both kinds are handled alike (see
// mounter.devices): a device is mounted once, out of the guest's sight,
// and each export is bound out of it.

// ninePOptions are the 9p mount options of the VM's exports.
const ninePOptions = "trans=virtio,version=9p2000.L,msize=262144"

// ninePMountOptions returns the mount options of a 9p device mounted in
// cache mode cache (a validated MountSource.Cache). Without a cache option
// Linux uses cache=none: nothing the host changes is ever stale in the
// guest, but every exec re-reads the binary and its libraries from the host.
func ninePMountOptions(cache string) string {
	if cache == protocol.NinePCacheNone {
		return ninePOptions
	}
	return ninePOptions + ",cache=" + cache
}

// deviceKind says how the devices of one MountSource kind are mounted.
type deviceKind struct {
	fstype string // mount(2)'s filesystem type; the source is the tag
	name   string // for messages
	// cacheModes: the source's Cache is the device's cache mode (9p),
	// fixed when the device is mounted. Otherwise Cache is ignored: a
	// virtio-fs device tells the guest what it may cache.
	cacheModes bool
	// optionsFor returns the mount options for a cache mode; nil: none.
	optionsFor func(cache string) string
	// readAheadKiB, when set, is the read-ahead window the device's
	// mount gets (package readahead says why).
	readAheadKiB int
}

// deviceKinds are the MountSource kinds served by a shared-filesystem device.
var deviceKinds = map[string]deviceKind{
	protocol.MountKindVirtioFS: {fstype: "virtiofs", name: "virtio-fs", readAheadKiB: readahead.VirtioFSKiB},
	protocol.MountKindNineP:    {fstype: "9p", name: "9p", cacheModes: true, optionsFor: ninePMountOptions},
}

// cache returns the cache mode a device of this kind is mounted with for src.
func (k deviceKind) cache(src protocol.MountSource) string {
	if k.cacheModes {
		return src.Cache
	}
	return ""
}

// options returns the mount options of a device of this kind mounted in
// cache mode cache.
func (k deviceKind) options(cache string) string {
	if k.optionsFor == nil {
		return ""
	}
	return k.optionsFor(cache)
}

// deviceKey names one shared-filesystem device: its kind and tag.
type deviceKey struct{ kind, tag string }

// deviceMount is one mounted shared-filesystem device.
type deviceMount struct {
	root  *os.File // O_PATH descriptor of the root of the device's tree
	cache string   // the cache mode it was mounted with (9p)
}

// mounter performs mounts and remembers what it mounted where.
//
// Process-backend design (SetupParams.NewRoot): the agent starts in a private
// mount namespace that still shows the host. Setup builds a tmpfs root, binds
// the system directories read-only into it, pivots into it and keeps the old
// root mounted at /.host under an empty read-only tmpfs cover. The agent holds
// an O_PATH descriptor to the old root, so a later bind mount of a host path
// (MountSource.Path) is resolved beneath that descriptor (openat2
// RESOLVE_IN_ROOT: symlinks resolve as on the host) and cloned from that
// descriptor (open_tree). Mount targets, unlike sources, never follow a
// symlink (mountpoint.go). Spawned processes run in a user+mount namespace nested in the
// agent's: their copies of the mounts are locked (the cover cannot be
// unmounted), mounts the agent adds later still propagate to them (the new
// root is a shared mount), and they have no capability over the agent, which
// is also non-dumpable, so /proc/1/fd and /proc/1/root are closed to them.
type mounter struct {
	log *slog.Logger

	mu       sync.Mutex
	hostRoot *os.File // O_PATH fd of the host root after a NewRoot setup
	// devices holds, per shared-filesystem device (virtio-fs or virtio-9p
	// tag), that device's mount. Linux lets a virtio-9p device be mounted
	// only once (a second mount of the tag fails with EBUSY), and a second
	// mount of a virtio-fs tag would only share the first one's
	// superblock; so each device is mounted once, at a covered private
	// staging point (see deviceRoot), and every export (a child of the
	// device's root, named by its aname) is bind-mounted out of it. A 9p
	// cache mode is the superblock's, hence one per tag.
	devices  map[deviceKey]deviceMount
	mounts   map[string]protocol.Mount // by target
	system   []string                  // the system mounts' targets, after setup
	setupRan bool
	// overlaid: the system mounts are overlays onto the root disk
	// (rootdisk.go), which isolated spawns may write: their user
	// namespaces map root's ids, so that their capabilities reach the
	// root-owned files there.
	overlaid bool
	// syncDirs are the mounts of writable disks (the root disk, the
	// bundle's images) that shutdown syncs (syncRootDisk).
	syncDirs []string
	// sessionTmp holds the sessions' /tmp on the root disk (sessiontmp.go);
	// "": each isolated spawn's /tmp is a tmpfs of its own.
	sessionTmp string
	// isolate: spawns get their session's view only (Options.IsolateSessions;
	// see isolate.go). Fixed at creation.
	isolate bool
}

func newMounter(log *slog.Logger, isolate bool) *mounter {
	return &mounter{log: log, mounts: make(map[string]protocol.Mount), devices: make(map[deviceKey]deviceMount), isolate: isolate}
}

// deviceRoot returns the root of the tree of the shared-filesystem device
// src names (its kind and tag: a validated source), mounting the device on
// first use; a 9p tag already mounted in another cache mode is an error
// (the mode cannot differ per export). The caller holds m.mu.
//
// The mount stays in the agent's mount namespace, at a private staging
// point covered by an empty read-only tmpfs: a mount detached from the
// tree (MNT_DETACH, or fsmount's before it is attached) cannot be the
// source of a bind on the kernels we run (open_tree(OPEN_TREE_CLONE) and
// mount(MS_BIND) refuse it with EINVAL), while the cover hides it from
// path lookups; the descriptor still reaches it through /proc/self/fd.
func (m *mounter) deviceRoot(src protocol.MountSource) (*os.File, error) {
	kind := deviceKinds[src.Kind]
	key, cache := deviceKey{src.Kind, src.Tag}, kind.cache(src)
	if dm, ok := m.devices[key]; ok {
		if err := cacheConflict(src.Tag, dm.cache, cache); err != nil {
			return nil, err
		}
		return dm.root, nil
	}
	stage, err := makeStagingDir()
	if err != nil {
		return nil, err
	}
	if err := unix.Mount(src.Tag, stage.procPath(), kind.fstype, unix.MS_NOSUID|unix.MS_NODEV, kind.options(cache)); err != nil {
		stage.release(true)
		return nil, fmt.Errorf("mounting the %s device %q: %w", kind.name, src.Tag, err)
	}
	var root mountPoint
	err = withRoot(func(top int) error {
		var err error
		root, err = walkDir(top, stage.path, noMkdir) // into the mount just made
		return err
	})
	stage.release(false)
	if err != nil {
		return nil, fmt.Errorf("opening the %s device %q: %w", kind.name, src.Tag, err)
	}
	if err := unix.Mount("tmpfs", root.procPath(), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, "mode=0000,size=4k"); err != nil {
		m.log.Warn("cannot cover the root of a file-sharing device; guest processes may reach it by path",
			"kind", kind.name, "tag", src.Tag, "path", stage.path, "err", err)
	}
	if kind.readAheadKiB > 0 {
		if err := readahead.Set(root.fd, kind.readAheadKiB); err != nil {
			m.log.Warn("cannot widen a file-sharing device's read-ahead; sequential reads are slower",
				"kind", kind.name, "tag", src.Tag, "err", err)
		}
	}
	f := os.NewFile(uintptr(root.fd), kind.fstype+":"+src.Tag)
	m.devices[key] = deviceMount{root: f, cache: cache}
	m.log.Debug("mounted a file-sharing device", "kind", kind.name, "tag", src.Tag, "cache", cacheName(cache))
	return f, nil
}

// deviceExport opens the export src names on its shared-filesystem device
// (mounting the device on first use), or the file rel inside it: beneath
// the device's root, no symlink followed. The caller holds m.mu.
func (m *mounter) deviceExport(src protocol.MountSource, rel string) (int, error) {
	root, err := m.deviceRoot(src)
	if err != nil {
		return -1, err
	}
	name := path.Join(src.Aname, rel)
	fd, err := beneath.OpenAt(int(root.Fd()), name, unix.OpenHow{Flags: unix.O_PATH})
	if err != nil {
		return -1, fmt.Errorf("the %s export %s:%s: %w", deviceKinds[src.Kind].name, src.Tag, name, err)
	}
	return fd, nil
}

// checkNinePCaches refuses mounts whose 9p cache mode differs from the mode
// their tag is mounted with, or from an earlier mount of the same tag in
// mts, before anything is mounted or replaced. The caller holds m.mu.
func (m *mounter) checkNinePCaches(mts ...protocol.Mount) error {
	modes := make(map[string]string)
	for key, dm := range m.devices {
		if key.kind == protocol.MountKindNineP {
			modes[key.tag] = dm.cache
		}
	}
	for _, mt := range mts {
		if mt.Source.Kind != protocol.MountKindNineP {
			continue
		}
		if have, ok := modes[mt.Source.Tag]; ok {
			if err := cacheConflict(mt.Source.Tag, have, mt.Source.Cache); err != nil {
				return fmt.Errorf("mount at %s: %w", mt.Target, err)
			}
			continue
		}
		modes[mt.Source.Tag] = mt.Source.Cache
	}
	return nil
}

// cacheConflict says why a 9p device mounted (or to be mounted) in cache
// mode have cannot serve a mount asking for want.
func cacheConflict(tag, have, want string) error {
	if have == want {
		return nil
	}
	return fmt.Errorf("the 9p device %q is mounted with cache mode %s, so it cannot serve a mount asking for cache mode %s "+
		"(a device is mounted once; every export of one tag needs the same cache mode)", tag, cacheName(have), cacheName(want))
}

// cacheName names a cache mode for messages.
func cacheName(cache string) string {
	if cache == protocol.NinePCacheNone {
		return "none"
	}
	return cache
}

func (m *mounter) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hostRoot != nil {
		m.hostRoot.Close()
		m.hostRoot = nil
	}
	for key, dm := range m.devices {
		dm.root.Close()
		delete(m.devices, key)
	}
}

// sandboxSpawns says whether spawns need the process backend's nested
// namespaces (after a NewRoot setup, unless spawns are isolated).
func (m *mounter) sandboxSpawns() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hostRoot != nil && !m.isolate
}

// spawnView returns what an isolated spawn of session sees of the agent's
// mounts (planRoot's binds) and the owners of those that are neither system
// mounts nor below one: its session's home and mounts, and other mounts
// such as `run --mount`'s.
func (m *mounter) spawnView(session string) (binds []string, owners []owner, err error) {
	m.mu.Lock()
	if !m.setupRan {
		m.mu.Unlock()
		return nil, nil, errors.New("the guest's root filesystem is not set up yet")
	}
	system := slices.Clone(m.system)
	var mounted []string
	for target := range m.mounts {
		mounted = append(mounted, target)
	}
	overlaid := m.overlaid
	m.mu.Unlock()
	binds = planRoot(system, mounted, session)
	var own []string
	if session != "" {
		own = append(own, path.Join(sessionsDir, session))
	}
	slices.Sort(mounted)
	for _, t := range mounted {
		underSystem := slices.ContainsFunc(system, func(s string) bool { return isBelow(t, s) })
		if !underSystem && slices.ContainsFunc(binds, func(b string) bool { return isBelow(t, b) }) {
			own = append(own, t)
		}
	}
	if overlaid {
		owners = append(owners, owner{0, 0}) // first: never left unmapped
	}
	for _, p := range own {
		st, err := statTarget(p) // no symlink followed: the session may have planted one
		if err != nil {
			continue
		}
		if o := (owner{st.Uid, st.Gid}); !slices.Contains(owners, o) {
			owners = append(owners, o)
		}
	}
	return binds, owners, nil
}

// mount performs one Mount. Mounting the same spec at the same target again is
// a no-op; a different spec replaces the earlier mount at that target. The
// target is walked without following symlinks (mountpoint.go).
func (m *mounter) mount(mt protocol.Mount) error {
	if err := validateMount(mt); err != nil {
		return err
	}
	if mt.Source.Kind == protocol.MountKindSymlink {
		return errors.New("a symlink is made only among setup's system mounts")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkNinePCaches(mt); err != nil {
		return err
	}
	return withRoot(func(root int) error {
		if prev, ok := m.mounts[mt.Target]; ok {
			if prev == mt {
				return nil
			}
			if err := detach(root, mt.Target); err != nil {
				return fmt.Errorf("replacing the mount at %s: %w", mt.Target, err)
			}
			delete(m.mounts, mt.Target)
		}
		if err := m.mountAt(mt, root, mt.Target); err != nil {
			return err
		}
		m.mounts[mt.Target] = mt
		return nil
	})
}

// unmount removes the mount the agent made at target, and every mount it
// made below it (a detach takes them along). A target it did not mount is
// an error; one already gone from the tree is not.
func (m *mounter) unmount(target string) error {
	if err := checkGuestPath(target); err != nil {
		return fmt.Errorf("unmount target: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.mounts[target]; !ok {
		return fmt.Errorf("nothing the agent mounted is at %s", target)
	}
	if slices.Contains(m.system, target) {
		return fmt.Errorf("%s is a system mount", target)
	}
	// Walked without symlinks: the path lies in a guest-writable session,
	// whose directories a guest process could swap for links to another's.
	if err := withRoot(func(root int) error { return detach(root, target) }); err != nil {
		return err
	}
	for t := range m.mounts {
		if isBelow(t, target) {
			delete(m.mounts, t)
		}
	}
	return nil
}

// mountAt performs mt at target, a path as seen from the directory root
// (the agent's root, or the new root it builds), walked beneath it.
func (m *mounter) mountAt(mt protocol.Mount, root int, target string) error {
	if mt.SourceFile != "" {
		return m.mountFile(mt, root, target)
	}
	var src int
	var name string
	switch mt.Source.Kind {
	case protocol.MountKindTmpfs:
		dst, err := walkDir(root, target, 0o755)
		if err != nil {
			return err
		}
		defer dst.close()
		return mountTmpfs(dst, mt.ReadOnly)
	case protocol.MountKindSymlink:
		return makeSymlink(root, target, mt.Source.Path)
	case protocol.MountKindBind:
		fd, err := m.resolveSource(mt.Source.Path)
		if err != nil {
			return err
		}
		src, name = fd, mt.Source.Path
	case protocol.MountKindVirtioFS, protocol.MountKindNineP:
		fd, err := m.deviceExport(mt.Source, "")
		if err != nil {
			return err
		}
		src, name = fd, mt.Source.Tag+":"+mt.Source.Aname
	default:
		return fmt.Errorf("unknown mount kind %q", mt.Source.Kind)
	}
	defer unix.Close(src)
	dst, err := walkDir(root, target, 0o755)
	if err != nil {
		return err
	}
	defer dst.close()
	return bindFrom(src, dst, mt.ReadOnly, name)
}

// maxLinkTarget bounds a symlink mount's target (PATH_MAX less its NUL).
const maxLinkTarget = unix.PathMax - 1

// makeSymlink makes target (beneath root, its parent directories made as
// needed) a symlink to link.
func makeSymlink(root int, target, link string) error {
	dir, err := walkDir(root, path.Dir(target), 0o755)
	if err != nil {
		return err
	}
	defer dir.close()
	if err := unix.Symlinkat(link, dir.fd, path.Base(target)); err != nil {
		return fmt.Errorf("making %s a symlink to %s: %w", target, link, err)
	}
	return nil
}

// mountFile binds the single file Source/SourceFile onto target (beneath
// root), made an empty file where missing.
func (m *mounter) mountFile(mt protocol.Mount, root int, target string) error {
	var src int
	var err error
	switch mt.Source.Kind {
	case protocol.MountKindBind:
		src, err = m.resolveSource(filepath.Join(mt.Source.Path, mt.SourceFile))
	case protocol.MountKindVirtioFS, protocol.MountKindNineP:
		src, err = m.deviceExport(mt.Source, mt.SourceFile)
	default:
		return fmt.Errorf("a single-file mount needs kind bind, virtiofs or 9p, got %q", mt.Source.Kind)
	}
	if err != nil {
		return fmt.Errorf("file to mount at %s: %w", target, err)
	}
	defer unix.Close(src)
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return fmt.Errorf("file to mount at %s: %w", target, err)
	} else if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("file to mount at %s is not a regular file", target)
	}
	dst, err := fileMountPoint(root, target)
	if err != nil {
		return err
	}
	// A file mount of a later install replaces the earlier one.
	if unix.Unmount(dst.procPath(), unix.MNT_DETACH) == nil {
		dst.close()
		if dst, err = fileMountPoint(root, target); err != nil {
			return err
		}
	}
	defer dst.close()
	return bindFrom(src, dst, mt.ReadOnly, filepath.Join(mt.Source.Path, mt.SourceFile))
}

// makeDirWritable covers the directory dir (beneath root) of a read-only
// mount with a tmpfs that holds the same entries: symlinks copied, files
// and directories bound read-only from the originals, each reached by
// descriptor. The copy is built at a private staging point and moved over
// dir whole, so dir never shows it half-made.
func makeDirWritable(root int, dir string) error {
	orig, err := walkDir(root, dir, noMkdir)
	if err != nil {
		return err
	}
	defer orig.close()
	names, err := entryNames(orig.fd)
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	stage, err := makeStagingDir()
	if err != nil {
		return err
	}
	defer stage.release(true)
	cp, err := newTmpfs(false)
	if err != nil {
		return fmt.Errorf("making %s writable: %w", dir, err)
	}
	defer unix.Close(cp)
	if err := unix.MoveMount(cp, "", stage.fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("making %s writable: mounting a tmpfs: %w", dir, err)
	}
	staged := fmt.Sprintf("/proc/self/fd/%d", cp)
	defer unix.Unmount(staged, unix.MNT_DETACH)
	// Under a shared root (the process backend's) the staged copy joins a
	// peer group, and so would the clone of it moved over dir: detaching
	// the staged copy would then take the entries bound in the clone with
	// it (umount propagates between peers), leaving dir's copy empty.
	if err := unix.Mount("", staged, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making %s writable: %w", dir, err)
	}
	for _, name := range names {
		if err := copyEntry(orig.fd, cp, name); err != nil {
			return fmt.Errorf("making %s writable: %s: %w", dir, name, err)
		}
	}
	tree, err := unix.OpenTree(cp, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("making %s writable: %w", dir, err)
	}
	defer unix.Close(tree)
	if err := attachTree(tree, orig, false, "a writable copy of "+dir); err != nil {
		return fmt.Errorf("making %s writable: covering it: %w", dir, err)
	}
	return nil
}

// entryNames lists the directory held by dir.
func entryNames(dir int) ([]string, error) {
	fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "directory")
	defer f.Close()
	return f.Readdirnames(-1)
}

// copyEntry copies the entry name of the directory src into dst, a fresh
// tmpfs of the agent's: a symlink as a symlink, anything else as an empty
// entry of its kind with the original bound on it read-only. An entry
// gone meanwhile is skipped; one swapped for a symlink meanwhile fails.
func copyEntry(src, dst int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(src, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil // vanished meanwhile
	}
	var err error
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(src, name, buf)
		if err != nil {
			return err
		}
		return unix.Symlinkat(string(buf[:n]), dst, name)
	case unix.S_IFDIR:
		err = unix.Mkdirat(dst, name, 0o755)
	default:
		var fd int
		if fd, err = unix.Openat(dst, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644); err == nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		return err
	}
	from, err := openComponent(src, name, 0)
	if err != nil {
		return err
	}
	defer unix.Close(from)
	to, err := openComponent(dst, name, 0)
	if err != nil {
		return err
	}
	onto := mountPoint{fd: to, path: name}
	defer onto.close()
	return bindFrom(from, onto, true, name)
}

// resolveSource opens (O_PATH) a host path to mount from. After a NewRoot
// setup the path is resolved beneath the host root descriptor (symlinks
// resolve as on the host, never out of it); before it, as a path of the
// agent's own. /proc magic links are never followed.
func (m *mounter) resolveSource(hostPath string) (int, error) {
	if !filepath.IsAbs(hostPath) {
		return -1, fmt.Errorf("mount source %q is not an absolute path", hostPath)
	}
	if m.hostRoot == nil {
		fd, err := openNoMagic(hostPath, unix.O_PATH|unix.O_CLOEXEC)
		if err != nil {
			return -1, fmt.Errorf("mount source %s: %w", hostPath, err)
		}
		return fd, nil
	}
	rel := strings.TrimPrefix(filepath.Clean(hostPath), "/")
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(int(m.hostRoot.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("host path %s: %w", hostPath, err)
	}
	return fd, nil
}

// bindFrom binds what the descriptor src holds (recursively) onto the held
// mount point dst, read-only if asked; name is the source as the user
// knows it, for errors.
func bindFrom(src int, dst mountPoint, readOnly bool, name string) error {
	tree, err := unix.OpenTree(src, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("binding %s at %s: %w", name, dst.path, err)
	}
	defer unix.Close(tree)
	return attachTree(tree, dst, readOnly, name)
}

// bindPath binds src, a path of the agent's own (symlinks followed, /proc
// magic links too: /proc/self/exe), onto the held mount point dst.
func bindPath(src string, dst mountPoint, readOnly bool, name string) error {
	fd, err := unix.Open(src, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("binding %s at %s: %w", name, dst.path, err)
	}
	defer unix.Close(fd)
	return bindFrom(fd, dst, readOnly, name)
}

// bindOnto binds the agent's path src onto target, an existing directory
// or file walked beneath "/" without symlinks.
func bindOnto(src, target string, readOnly bool, name string) error {
	return withRoot(func(root int) error {
		dst, err := lookupTarget(root, target)
		if err != nil {
			return err
		}
		defer dst.close()
		return bindPath(src, dst, readOnly, name)
	})
}

// attachTree moves the detached mount tree (open_tree's or fsmount's)
// onto the held mount point dst. Made read-only while still detached, it
// is never visible writable; on kernels without mount_setattr (before
// 5.12) its top mount is remounted read-only once attached.
func attachTree(tree int, dst mountPoint, readOnly bool, name string) error {
	remount := false
	if readOnly {
		err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY})
		switch {
		case errors.Is(err, unix.ENOSYS):
			remount = true
		case err != nil:
			return fmt.Errorf("making the bind of %s read-only: %w", name, err)
		}
	}
	if err := unix.MoveMount(tree, "", dst.fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("binding %s at %s: %w", name, dst.path, err)
	}
	if remount {
		return remountReadOnly(tree, dst.path)
	}
	return nil
}

// remountReadOnly remounts the attached mount whose root tree holds
// read-only, keeping the flags that a user namespace is not allowed to
// clear; on failure it is detached.
func remountReadOnly(tree int, where string) error {
	top := fmt.Sprintf("/proc/self/fd/%d", tree)
	var st unix.Statfs_t
	if err := unix.Fstatfs(tree, &st); err != nil {
		_ = unix.Unmount(top, unix.MNT_DETACH)
		return fmt.Errorf("making %s read-only: %w", where, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	for _, f := range []struct{ st, ms int64 }{
		{unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV}, {unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if st.Flags&f.st != 0 {
			flags |= uintptr(f.ms)
		}
	}
	if err := unix.Mount("", top, "", flags, ""); err != nil {
		_ = unix.Unmount(top, unix.MNT_DETACH)
		return fmt.Errorf("making %s read-only: %w", where, err)
	}
	return nil
}

// newTmpfs makes a detached tmpfs (mode 0755, nosuid, nodev, read-only if
// asked) and returns the descriptor of its root.
func newTmpfs(readOnly bool) (int, error) {
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("a tmpfs: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "mode", "0755"); err != nil {
		return -1, fmt.Errorf("a tmpfs: %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("a tmpfs: %w", err)
	}
	attrs := unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	if readOnly {
		attrs |= unix.MOUNT_ATTR_RDONLY
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("a tmpfs: %w", err)
	}
	return fd, nil
}

// mountTmpfs mounts a fresh tmpfs on the held mount point dst.
func mountTmpfs(dst mountPoint, readOnly bool) error {
	fd, err := newTmpfs(readOnly)
	if err != nil {
		return fmt.Errorf("mounting a tmpfs at %s: %w", dst.path, err)
	}
	defer unix.Close(fd)
	if err := unix.MoveMount(fd, "", dst.fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting a tmpfs at %s: %w", dst.path, err)
	}
	return nil
}

// validateMount rejects mounts the agent must not perform.
func validateMount(mt protocol.Mount) error {
	if err := checkGuestPath(mt.Target); err != nil {
		return fmt.Errorf("mount target: %w", err)
	}
	if mt.Target == "/" || mt.Target == hostRootDir || strings.HasPrefix(mt.Target, hostRootDir+"/") ||
		mt.Target == stagingDir || strings.HasPrefix(mt.Target, stagingDir+"/") {
		return fmt.Errorf("mount target %s is reserved", mt.Target)
	}
	if mt.SourceFile != "" {
		if filepath.IsAbs(mt.SourceFile) || filepath.Clean(mt.SourceFile) != mt.SourceFile || mt.SourceFile == "." ||
			mt.SourceFile == ".." || strings.HasPrefix(mt.SourceFile, "../") {
			return fmt.Errorf("mount sourceFile %q must be a plain relative path", mt.SourceFile)
		}
	}
	if _, device := deviceKinds[mt.Source.Kind]; !device && mt.Source.Cache != "" {
		return fmt.Errorf("a %s mount has no cache mode (got %q): only 9p sources do", mt.Source.Kind, mt.Source.Cache)
	}
	switch mt.Source.Kind {
	case protocol.MountKindBind:
		if err := checkGuestPath(mt.Source.Path); err != nil {
			return fmt.Errorf("bind mount source: %w", err)
		}
	case protocol.MountKindVirtioFS, protocol.MountKindNineP:
		if err := validateDeviceSource(mt.Source); err != nil {
			return err
		}
	case protocol.MountKindTmpfs:
		if mt.SourceFile != "" {
			return errors.New("a tmpfs mount cannot be a single-file mount")
		}
	case protocol.MountKindSymlink:
		if mt.SourceFile != "" || mt.Source.Path == "" || len(mt.Source.Path) > maxLinkTarget || strings.ContainsRune(mt.Source.Path, 0) {
			return fmt.Errorf("a symlink at %s needs a target of 1 to %d bytes without NUL and no sourceFile", mt.Target, maxLinkTarget)
		}
	default:
		return fmt.Errorf("unknown mount kind %q (want bind, virtiofs, 9p, tmpfs or symlink)", mt.Source.Kind)
	}
	return nil
}

// validateDeviceSource checks the source of a mount out of a
// shared-filesystem device (kind virtiofs or 9p): a tag, an aname naming
// one export, nothing a mount option string could be split at, and for
// 9p a known cache mode (virtio-fs ignores Cache).
func validateDeviceSource(src protocol.MountSource) error {
	kind := deviceKinds[src.Kind]
	for _, v := range []string{src.Tag, src.Aname} {
		if strings.ContainsAny(v, ",\x00") {
			return fmt.Errorf("%s tag and aname must not contain commas or NUL bytes: %q", kind.name, v)
		}
	}
	if src.Tag == "" {
		return fmt.Errorf("a %s mount needs a tag", kind.name)
	}
	if a := src.Aname; a == "" || a == "." || a == ".." || strings.ContainsRune(a, '/') {
		return fmt.Errorf("%s aname %q must name one export (a single path component)", kind.name, a)
	}
	if c := src.Cache; kind.cacheModes && c != protocol.NinePCacheNone && c != protocol.NinePCacheLoose {
		return fmt.Errorf("unknown %s cache mode %q (want %q or none)", kind.name, c, protocol.NinePCacheLoose)
	}
	return nil
}

// checkGuestPath accepts absolute, clean paths without NUL bytes.
func checkGuestPath(p string) error {
	if p == "" || p[0] != '/' {
		return fmt.Errorf("%q is not an absolute path", p)
	}
	if filepath.Clean(p) != p || strings.ContainsRune(p, 0) {
		return fmt.Errorf("%q is not a clean path", p)
	}
	return nil
}
