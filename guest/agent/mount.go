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

// ninePMount is one mounted virtio-9p device.
type ninePMount struct {
	root  *os.File // O_PATH descriptor of the device's attach root
	cache string   // the cache mode it was mounted with
}

// mounter performs mounts and remembers what it mounted where.
//
// Process-backend design (SetupParams.NewRoot): the agent starts in a private
// mount namespace that still shows the host. Setup builds a tmpfs root, binds
// the system directories read-only into it, pivots into it and keeps the old
// root mounted at /.host under an empty read-only tmpfs cover. The agent holds
// an O_PATH descriptor to the old root, so a later bind mount of a host path
// (MountSource.Path) is resolved beneath that descriptor (openat2
// RESOLVE_IN_ROOT: symlinks resolve as on the host) and bound through
// /proc/self/fd. Spawned processes run in a user+mount namespace nested in the
// agent's: their copies of the mounts are locked (the cover cannot be
// unmounted), mounts the agent adds later still propagate to them (the new
// root is a shared mount), and they have no capability over the agent, which
// is also non-dumpable, so /proc/1/fd and /proc/1/root are closed to them.
type mounter struct {
	log *slog.Logger

	mu       sync.Mutex
	hostRoot *os.File // O_PATH fd of the host root after a NewRoot setup
	// ninePRoots holds, per virtio-9p tag, that device's mount. Linux lets
	// a virtio-9p device be mounted only once (a second mount of the tag
	// fails with EBUSY), so each tag is mounted once, at a covered private
	// staging point (see ninePRoot), and every export (a child of the attach
	// root, named by its aname) is bind-mounted out of it. The cache mode
	// is the superblock's, hence one per tag.
	ninePRoots map[string]ninePMount
	mounts     map[string]protocol.Mount // by target
	system     []string                  // the system mounts' targets, after setup
	setupRan   bool
	// isolate: spawns get their session's view only (Options.IsolateSessions;
	// see isolate.go). Fixed at creation.
	isolate bool
}

func newMounter(log *slog.Logger, isolate bool) *mounter {
	return &mounter{log: log, mounts: make(map[string]protocol.Mount), ninePRoots: make(map[string]ninePMount), isolate: isolate}
}

// ninePRoot returns the attach root of the virtio-9p device with this tag,
// mounting it in cache mode cache on first use; a tag already mounted in
// another mode is an error (the mode cannot differ per export). The caller
// holds m.mu.
//
// The mount stays in the agent's mount namespace, at a private staging
// point covered by an empty read-only tmpfs: a mount detached from the
// tree (MNT_DETACH) cannot be the source of a bind on the kernels we run
// (open_tree(OPEN_TREE_CLONE) and mount(MS_BIND) refuse it with EINVAL),
// while the cover hides it from path lookups; the descriptor still reaches
// it through /proc/self/fd.
func (m *mounter) ninePRoot(tag, cache string) (*os.File, error) {
	if nm, ok := m.ninePRoots[tag]; ok {
		if err := cacheConflict(tag, nm.cache, cache); err != nil {
			return nil, err
		}
		return nm.root, nil
	}
	stage, err := makeStagingDir()
	if err != nil {
		return nil, err
	}
	if err := unix.Mount(tag, stage, "9p", unix.MS_NOSUID|unix.MS_NODEV, ninePMountOptions(cache)); err != nil {
		_ = os.Remove(stage)
		return nil, fmt.Errorf("mounting the 9p device %q: %w", tag, err)
	}
	fd, err := unix.Open(stage, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Unmount(stage, unix.MNT_DETACH)
		_ = os.Remove(stage)
		return nil, fmt.Errorf("opening the 9p device %q: %w", tag, err)
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, "mode=0000,size=4k"); err != nil {
		m.log.Warn("cannot cover the 9p attach root; guest processes may reach it by path", "tag", tag, "path", stage, "err", err)
	}
	f := os.NewFile(uintptr(fd), "9p:"+tag)
	m.ninePRoots[tag] = ninePMount{root: f, cache: cache}
	m.log.Debug("mounted a 9p device", "tag", tag, "cache", cacheName(cache))
	return f, nil
}

// checkNinePCaches refuses mounts whose 9p cache mode differs from the mode
// their tag is mounted with, or from an earlier mount of the same tag in
// mts, before anything is mounted or replaced. The caller holds m.mu.
func (m *mounter) checkNinePCaches(mts ...protocol.Mount) error {
	modes := make(map[string]string)
	for tag, nm := range m.ninePRoots {
		modes[tag] = nm.cache
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
	for tag, nm := range m.ninePRoots {
		nm.root.Close()
		delete(m.ninePRoots, tag)
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
	m.mu.Unlock()
	binds = planRoot(system, mounted, session)
	var own []string
	if session != "" {
		own = append(own, path.Join(sessionsDir, session))
	}
	slices.Sort(mounted)
	for _, t := range mounted {
		underSystem := slices.ContainsFunc(system, func(s string) bool { return beneath(t, s) })
		if !underSystem && slices.ContainsFunc(binds, func(b string) bool { return beneath(t, b) }) {
			own = append(own, t)
		}
	}
	for _, p := range own {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil {
			continue
		}
		if o := (owner{st.Uid, st.Gid}); !slices.Contains(owners, o) {
			owners = append(owners, o)
		}
	}
	return binds, owners, nil
}

// mount performs one Mount. Mounting the same spec at the same target again is
// a no-op; a different spec replaces the earlier mount at that target.
func (m *mounter) mount(mt protocol.Mount) error {
	if err := validateMount(mt); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkNinePCaches(mt); err != nil {
		return err
	}
	if prev, ok := m.mounts[mt.Target]; ok {
		if prev == mt {
			return nil
		}
		if err := unix.Unmount(mt.Target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("replacing the mount at %s: %w", mt.Target, err)
		}
		delete(m.mounts, mt.Target)
	}
	if err := m.mountAt(mt, mt.Target); err != nil {
		return err
	}
	m.mounts[mt.Target] = mt
	return nil
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
	// Resolved without symlinks: the path lies in a guest-writable session,
	// whose directories a guest process could swap for links to another's.
	fd, err := unix.Openat2(unix.AT_FDCWD, target, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	switch {
	case errors.Is(err, unix.ENOENT):
		// Gone from the tree already; forget it below.
	case err != nil:
		return fmt.Errorf("unmounting %s: %w", target, err)
	default:
		err = unix.Unmount(fmt.Sprintf("/proc/self/fd/%d", fd), unix.MNT_DETACH)
		unix.Close(fd)
		if err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmounting %s: %w", target, err)
		}
	}
	for t := range m.mounts {
		if beneath(t, target) {
			delete(m.mounts, t)
		}
	}
	return nil
}

// mountAt performs mt at target (a path in the agent's current root).
func (m *mounter) mountAt(mt protocol.Mount, target string) error {
	if mt.SourceFile != "" {
		return m.mountFile(mt, target)
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("creating mount point %s: %w", target, err)
	}
	pinned, closeTarget, err := pinTarget(target)
	if err != nil {
		return err
	}
	defer closeTarget()
	switch mt.Source.Kind {
	case protocol.MountKindBind:
		src, closeSrc, err := m.resolveSource(mt.Source.Path)
		if err != nil {
			return err
		}
		defer closeSrc()
		return bindMount(src, pinned, target, mt.ReadOnly, mt.Source.Path)
	case protocol.MountKindNineP:
		root, err := m.ninePRoot(mt.Source.Tag, mt.Source.Cache)
		if err != nil {
			return err
		}
		src := fmt.Sprintf("/proc/self/fd/%d/%s", root.Fd(), mt.Source.Aname)
		return bindMount(src, pinned, target, mt.ReadOnly, mt.Source.Tag+":"+mt.Source.Aname)
	case protocol.MountKindTmpfs:
		var flags uintptr = unix.MS_NOSUID | unix.MS_NODEV
		if mt.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount("tmpfs", pinned, "tmpfs", flags, "mode=0755"); err != nil {
			return fmt.Errorf("mounting a tmpfs at %s: %w", target, err)
		}
		return nil
	}
	return fmt.Errorf("unknown mount kind %q", mt.Source.Kind)
}

// mountFile binds the single file Source/SourceFile onto target.
func (m *mounter) mountFile(mt protocol.Mount, target string) error {
	var src string
	switch mt.Source.Kind {
	case protocol.MountKindBind:
		s, closeSrc, err := m.resolveSource(filepath.Join(mt.Source.Path, mt.SourceFile))
		if err != nil {
			return err
		}
		defer closeSrc()
		src = s
	case protocol.MountKindNineP:
		// Mount the export at a private staging point, bind the file out of
		// it, then detach the staging mount (the file bind keeps it alive).
		stage, err := makeStagingDir()
		if err != nil {
			return err
		}
		defer os.Remove(stage)
		dirMount := mt
		dirMount.SourceFile = ""
		if err := m.mountAt(dirMount, stage); err != nil {
			return err
		}
		defer unix.Unmount(stage, unix.MNT_DETACH)
		src = filepath.Join(stage, mt.SourceFile)
	default:
		return fmt.Errorf("a single-file mount needs kind bind or 9p, got %q", mt.Source.Kind)
	}
	if st, err := os.Stat(src); err != nil {
		return fmt.Errorf("file to mount at %s: %w", target, err)
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("file to mount at %s is not a regular file", target)
	}
	if err := ensureFileTarget(target); err != nil {
		return err
	}
	// A file mount of a later install replaces the earlier one.
	_ = unix.Unmount(target, unix.MNT_DETACH)
	pinned, closeTarget, err := pinTarget(target)
	if err != nil {
		return err
	}
	defer closeTarget()
	return bindMount(src, pinned, target, mt.ReadOnly, filepath.Join(mt.Source.Path, mt.SourceFile))
}

// ensureFileTarget creates an empty file at target to mount on. When its
// directory is read-only (e.g. /usr/local/bin inside a read-only /usr), the
// directory is first replaced by a tmpfs holding the same entries (each bound
// from the original), so the new file can be added beside them.
func ensureFileTarget(target string) error {
	if st, err := os.Lstat(target); err == nil {
		if !st.Mode().IsRegular() {
			return fmt.Errorf("mount point %s exists and is not a regular file", target)
		}
		return nil
	}
	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		if !errors.Is(err, unix.EROFS) {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
		// Make the nearest existing ancestor writable, then retry.
		anc := dir
		for {
			if _, serr := os.Stat(anc); serr == nil {
				break
			}
			anc = filepath.Dir(anc)
		}
		if werr := makeDirWritable(anc); werr != nil {
			return werr
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o755)
	if errors.Is(err, unix.EROFS) {
		if werr := makeDirWritable(dir); werr != nil {
			return werr
		}
		f, err = os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o755)
	}
	if err != nil {
		return fmt.Errorf("creating mount point %s: %w", target, err)
	}
	return f.Close()
}

// makeDirWritable covers a directory of a read-only mount with a tmpfs that
// holds the same entries: symlinks copied, files and directories bound
// read-only from the originals.
func makeDirWritable(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	stage, err := makeStagingDir()
	if err != nil {
		return err
	}
	defer os.Remove(stage)
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("making %s writable: mounting a tmpfs: %w", dir, err)
	}
	defer unix.Unmount(stage, unix.MNT_DETACH)
	for _, e := range entries {
		src := filepath.Join(dir, e.Name())
		dst := filepath.Join(stage, e.Name())
		st, err := os.Lstat(src)
		if err != nil {
			continue // vanished meanwhile
		}
		switch {
		case st.Mode()&os.ModeSymlink != 0:
			link, err := os.Readlink(src)
			if err != nil {
				return fmt.Errorf("making %s writable: %w", dir, err)
			}
			if err := os.Symlink(link, dst); err != nil {
				return fmt.Errorf("making %s writable: %w", dir, err)
			}
			continue
		case st.IsDir():
			if err := os.Mkdir(dst, 0o755); err != nil {
				return fmt.Errorf("making %s writable: %w", dir, err)
			}
		default:
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return fmt.Errorf("making %s writable: %w", dir, err)
			}
			f.Close()
		}
		if err := bindMount(src, dst, dst, true, src); err != nil {
			return fmt.Errorf("making %s writable: %w", dir, err)
		}
	}
	if err := unix.Mount(stage, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s writable: covering it: %w", dir, err)
	}
	return nil
}

// pinTarget resolves a mount point once, refusing /proc magic links (a
// guest-made symlink such as mnt -> /proc/self/fd/N must not steer a mount
// onto the agent's descriptors), and returns a /proc/self/fd path for it.
func pinTarget(target string) (string, func(), error) {
	fd, err := openNoMagic(target, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return "", nil, fmt.Errorf("mount point %s: %w", target, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d", fd), func() { unix.Close(fd) }, nil
}

// resolveSource returns a path the agent can mount from for a host path, and
// a func releasing it. After a NewRoot setup the path is resolved beneath the
// host root descriptor.
func (m *mounter) resolveSource(hostPath string) (string, func(), error) {
	if !filepath.IsAbs(hostPath) {
		return "", nil, fmt.Errorf("mount source %q is not an absolute path", hostPath)
	}
	if m.hostRoot == nil {
		return hostPath, func() {}, nil
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
		return "", nil, fmt.Errorf("host path %s: %w", hostPath, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d", fd), func() { unix.Close(fd) }, nil
}

// bindMount binds src (recursively) onto target, read-only if asked. target
// may be a pinned /proc/self/fd path; plainTarget is the same mount point by
// name (used only on kernels without mount_setattr); name is the source as
// the user knows it, for errors.
//
// With the new mount API the copy is made read-only while still detached, so
// it is never visible writable.
func bindMount(src, target, plainTarget string, readOnly bool, name string) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if errors.Is(err, unix.ENOSYS) {
		return legacyBindMount(src, target, plainTarget, readOnly, name)
	}
	if err != nil {
		return fmt.Errorf("binding %s at %s: %w", name, plainTarget, err)
	}
	defer unix.Close(tree)
	if readOnly {
		err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY})
		if errors.Is(err, unix.ENOSYS) {
			return legacyBindMount(src, target, plainTarget, readOnly, name)
		}
		if err != nil {
			return fmt.Errorf("making the bind of %s read-only: %w", name, err)
		}
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_SYMLINKS); err != nil {
		return fmt.Errorf("binding %s at %s: %w", name, plainTarget, err)
	}
	return nil
}

// legacyBindMount is bindMount for kernels before 5.12: bind, then remount
// the top mount read-only, keeping the flags that a user namespace is not
// allowed to clear.
func legacyBindMount(src, target, plainTarget string, readOnly bool, name string) error {
	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s at %s: %w", name, plainTarget, err)
	}
	if !readOnly {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(plainTarget, &st); err != nil {
		_ = unix.Unmount(plainTarget, unix.MNT_DETACH)
		return fmt.Errorf("making %s read-only: %w", plainTarget, err)
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
	if err := unix.Mount("", plainTarget, "", flags, ""); err != nil {
		_ = unix.Unmount(plainTarget, unix.MNT_DETACH)
		return fmt.Errorf("making %s read-only: %w", plainTarget, err)
	}
	return nil
}

// makeStagingDir creates a fresh private mount point under stagingDir.
func makeStagingDir() (string, error) {
	if err := os.MkdirAll(stagingDir, 0o700); err != nil {
		return "", fmt.Errorf("creating the agent's staging directory: %w", err)
	}
	d, err := os.MkdirTemp(stagingDir, "m")
	if err != nil {
		return "", fmt.Errorf("creating a staging mount point: %w", err)
	}
	return d, nil
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
	if mt.Source.Kind != protocol.MountKindNineP && mt.Source.Cache != "" {
		return fmt.Errorf("a %s mount has no cache mode (got %q): only 9p sources do", mt.Source.Kind, mt.Source.Cache)
	}
	switch mt.Source.Kind {
	case protocol.MountKindBind:
		if err := checkGuestPath(mt.Source.Path); err != nil {
			return fmt.Errorf("bind mount source: %w", err)
		}
	case protocol.MountKindNineP:
		for _, v := range []string{mt.Source.Tag, mt.Source.Aname} {
			if strings.ContainsAny(v, ",\x00") {
				return fmt.Errorf("9p tag and aname must not contain commas or NUL bytes: %q", v)
			}
		}
		if mt.Source.Tag == "" {
			return errors.New("a 9p mount needs a tag")
		}
		if a := mt.Source.Aname; a == "" || a == "." || a == ".." || strings.ContainsRune(a, '/') {
			return fmt.Errorf("9p aname %q must name one export (a single path component)", a)
		}
		if c := mt.Source.Cache; c != protocol.NinePCacheNone && c != protocol.NinePCacheLoose {
			return fmt.Errorf("unknown 9p cache mode %q (want %q or none)", c, protocol.NinePCacheLoose)
		}
	case protocol.MountKindTmpfs:
		if mt.SourceFile != "" {
			return errors.New("a tmpfs mount cannot be a single-file mount")
		}
	default:
		return fmt.Errorf("unknown mount kind %q (want bind, 9p or tmpfs)", mt.Source.Kind)
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
