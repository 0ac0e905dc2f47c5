package agent

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// devNodes are bound one by one from the host's /dev into a NewRoot's /dev
// (a user namespace may not create device nodes).
var devNodes = []string{"null", "zero", "full", "random", "urandom"}

// ttyNode is /dev/tty, a process's controlling terminal. An isolated
// spawn's /dev (the VM's, whose terminals are the guest kernel's) has it;
// a NewRoot's does not: that /dev is the process backend's, on the host,
// where the controlling terminal of anything that reached it would be the
// user's own (the agent starts in a session of its own, without one).
const ttyNode = "tty"

// setup lays out the guest root once. See the mounter comment for the design.
func (m *mounter) setup(p protocol.SetupParams, timer *stepTimer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.setupRan {
		return errors.New("setup was already done for this guest")
	}
	for _, mt := range p.System {
		if err := validateMount(mt); err != nil {
			return fmt.Errorf("system mount: %w", err)
		}
	}
	if err := m.checkNinePCaches(p.System...); err != nil {
		return fmt.Errorf("system mounts: %w", err)
	}
	if p.ImageRoot != nil {
		if err := validateImageRoot(*p.ImageRoot); err != nil {
			return err
		}
		if p.NewRoot || len(p.System) > 0 || p.RootDisk != nil {
			return errors.New("an image root comes without system mounts, a root disk or a new root")
		}
	}
	var err error
	system := p.System
	if p.NewRoot {
		err = m.setupNewRoot(p.System)
		timer.done("new_root")
	} else {
		system, err = m.setupInPlace(p.System, p.ImageRoot, timer)
	}
	if err != nil {
		return err
	}
	for _, mt := range system {
		m.system = append(m.system, mt.Target)
	}
	for _, at := range []string{protocol.GuestToolPath, SudoToolPath} {
		if err := bindTool(at); err != nil {
			m.log.Warn("spawned processes get no "+at, "err", err)
		} else {
			m.system = append(m.system, at)
		}
	}
	timer.done("bind_tool")
	m.setupRan = true
	return nil
}

// bindTool binds the agent's own executable read-only at at:
// protocol.GuestToolPath, where spawned processes find the guest-request
// command, and SudoToolPath (sudo.go); listed with the system mounts, they
// are in isolated spawns' roots too. The executable is reached through
// /proc/self/exe: in the VM it is /init, on the rootfs the agent left
// (leaveRootfs).
func bindTool(at string) error {
	return withRoot(func(root int) error {
		dst, err := fileMountPoint(root, at)
		if err != nil {
			return err
		}
		defer dst.close()
		return bindPath("/proc/self/exe", dst, true, "the agent's executable")
	})
}

// setupInPlace mounts the system directories on the current root (the VM's
// tmpfs root, see leaveRootfs) and creates /sessions.
//
// With isolated spawns the root's mounts are made shared first, so that a
// mount the agent makes later (below a session's home, or the SDK in
// /usr/local/bin) propagates into the mount namespaces of running spawns,
// whose copies are its slaves; and the staging directory gets a private
// tmpfs, so that what is mounted there (the roots of the file-sharing
// devices, with every export) is not shared with anything.
//
// With image, the system mounts are the bundle image's directories
// (imageroot.go) instead of system; it returns those it mounted.
func (m *mounter) setupInPlace(system []protocol.Mount, image *protocol.ImageRoot, timer *stepTimer) ([]protocol.Mount, error) {
	if m.isolate {
		if err := prepareStaging(); err != nil {
			return nil, err
		}
		timer.done("shared_root")
	}
	if image != nil {
		var err error
		if system, err = m.stageImage(*image, timer); err != nil {
			return nil, err
		}
		m.overlaid = true // the image's root-owned files are writable through sudo
	}
	return system, withRoot(func(root int) error {
		for _, mt := range system {
			if err := m.mountAt(mt, root, mt.Target); err != nil {
				return fmt.Errorf("system mount %s: %w", mt.Target, err)
			}
			if mt.Source.Kind != protocol.MountKindSymlink {
				m.mounts[mt.Target] = mt
			}
			timer.done("mount:" + mt.Target)
		}
		sessions, err := walkDir(root, sessionsDir, 0o755)
		if err != nil {
			return fmt.Errorf("creating %s: %w", sessionsDir, err)
		}
		sessions.close()
		return nil
	})
}

// prepareStaging makes the root's mounts shared and gives the staging
// directory a private tmpfs (see setupInPlace).
func prepareStaging() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("sharing the guest root's mounts: %w", err)
	}
	if err := os.MkdirAll(stagingDir, 0o700); err != nil {
		return fmt.Errorf("creating the agent's staging directory: %w", err)
	}
	if err := unix.Mount("tmpfs", stagingDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		return fmt.Errorf("mounting the agent's staging directory: %w", err)
	}
	if err := unix.Mount("", stagingDir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the agent's staging directory private: %w", err)
	}
	return nil
}

// setupNewRoot builds a tmpfs root, pivots into it and keeps the host root
// reachable only through m.hostRoot.
func (m *mounter) setupNewRoot(system []protocol.Mount) (err error) {
	// Nothing we do may propagate back to the host's mount namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("the sandbox may not mount (user namespaces without capabilities: on Ubuntu 23.10+ AppArmor's "+
				"kernel.apparmor_restrict_unprivileged_userns does this; allow it or use the kvm backend): %w", err)
		}
		return fmt.Errorf("making the agent's mounts private (is the agent in its own mount namespace?): %w", err)
	}
	root, err := os.MkdirTemp("", "cowork-vmm-root-")
	if err != nil {
		return fmt.Errorf("creating the new root's mount point: %w", err)
	}
	pivoted := false
	defer func() {
		if !pivoted {
			_ = unix.Unmount(root, unix.MNT_DETACH)
			_ = os.Remove(root)
		}
	}()
	if err := m.buildNewRoot(root, system); err != nil {
		return err
	}

	// Pivot; the old root lands on hostRootDir.
	if err := unix.PivotRoot(root, filepath.Join(root, hostRootDir)); err != nil {
		return fmt.Errorf("pivoting into the new root: %w", err)
	}
	pivoted = true
	return m.coverHostRoot(root)
}

// buildNewRoot fills the tmpfs mounted at root: the system mounts (a
// system "directory" that is a symlink on the host stays one), the agent's
// directories, /tmp, /dev and /proc. Every path in it is walked beneath
// the new root's descriptor (mountpoint.go).
func (m *mounter) buildNewRoot(root string, system []protocol.Mount) error {
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting the new root's tmpfs: %w", err)
	}
	top, err := openRoot(root)
	if err != nil {
		return err
	}
	defer unix.Close(top)
	for _, mt := range system {
		if err := m.buildSystemMount(top, mt); err != nil {
			return fmt.Errorf("system mount %s: %w", mt.Target, err)
		}
	}
	for _, d := range []struct {
		name string
		mode uint32
	}{{"proc", 0o555}, {"dev", 0o755}, {"tmp", 0o1777}, {"sessions", 0o755}, {strings.TrimPrefix(stagingDir, "/"), 0o700}, {strings.TrimPrefix(hostRootDir, "/"), 0o700}} {
		dir, err := walkDir(top, "/"+d.name, d.mode)
		if err != nil {
			return fmt.Errorf("creating /%s in the new root: %w", d.name, err)
		}
		dir.close()
	}
	if err := unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mounting /tmp: %w", err)
	}
	if err := setupDev(filepath.Join(root, "dev"), devNodes); err != nil {
		return err
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc (the agent needs its own PID namespace): %w", err)
	}
	return maskProcFiles(filepath.Join(root, "proc"))
}

// maskedProcFiles are the files of a NewRoot's /proc covered with an empty
// one: /proc is not namespaced for them, and on the host (the process
// backend) they list the user's kernel keys by name — Kerberos
// credential caches, fscrypt and ecryptfs keys — which spawns may not
// read through keyctl either (guest/seccomp). Docker masks them too.
var maskedProcFiles = []string{"keys", "key-users"}

// maskProcFiles binds /dev/null read-only over maskedProcFiles in proc.
// Spawns cannot lift the cover: the mount is locked in their user
// namespace, and a /proc of their own needs a PID namespace of theirs.
func maskProcFiles(proc string) error {
	for _, name := range maskedProcFiles {
		target := filepath.Join(proc, name)
		if _, err := os.Stat(target); errors.Is(err, os.ErrNotExist) {
			continue // a kernel without keyrings
		}
		if err := unix.Mount(os.DevNull, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("covering /proc/%s: %w", name, err)
		}
		// Not nodev: /dev/null must stay readable (it reads as empty).
		if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("covering /proc/%s read-only: %w", name, err)
		}
	}
	return nil
}

// buildSystemMount performs one system mount in the new root held by top.
// A system "directory" that is a symlink on the host (merged-/usr /bin ->
// usr/bin) stays a symlink.
func (m *mounter) buildSystemMount(top int, mt protocol.Mount) error {
	if mt.Source.Kind != protocol.MountKindBind || mt.SourceFile != "" {
		return m.mountAt(mt, top, mt.Target)
	}
	st, err := os.Lstat(mt.Source.Path)
	if err != nil || st.Mode()&os.ModeSymlink == 0 {
		return m.mountAt(mt, top, mt.Target)
	}
	link, err := os.Readlink(mt.Source.Path)
	if err != nil {
		return err
	}
	dir, err := walkDir(top, path.Dir(mt.Target), 0o755)
	if err != nil {
		return err
	}
	defer dir.close()
	return unix.Symlinkat(link, dir.fd, path.Base(mt.Target))
}

// coverHostRoot runs in the new root, after the pivot from the host root's
// mount point root: it keeps the host root reachable through m.hostRoot
// only, under an empty read-only cover, and shares the new root's mounts.
func (m *mounter) coverHostRoot(root string) error {
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering the new root: %w", err)
	}
	hostFD, err := unix.Open(hostRootDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the host root: %w", err)
	}
	m.hostRoot = os.NewFile(uintptr(hostFD), "host-root")
	// The mount point the new root had on the host is now an empty directory.
	_ = unix.Unlinkat(hostFD, strings.TrimPrefix(root, "/"), unix.AT_REMOVEDIR)

	// Mounts made later (sessions, shares) propagate into spawned processes'
	// namespaces; the host root's subtree stays private.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("sharing the new root: %w", err)
	}
	if err := unix.Mount("", hostRootDir, "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the host root private: %w", err)
	}
	if err := unix.Mount("tmpfs", hostRootDir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0000,size=4k"); err != nil {
		return fmt.Errorf("covering the host root: %w", err)
	}
	// Close /proc/1/fd (our host-root descriptor) and /proc/1/root to the
	// spawned processes.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the agent non-dumpable: %w", err)
	}
	return nil
}

// setupDev fills a new root's /dev: a tmpfs with nodes bound from the
// agent's /dev, the usual symlinks, /dev/shm and (if possible) a private
// devpts.
func setupDev(dev string, nodes []string) error {
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return fmt.Errorf("mounting /dev: %w", err)
	}
	for _, name := range nodes {
		src := "/dev/" + name
		if _, err := os.Stat(src); err != nil {
			continue
		}
		dst := filepath.Join(dev, name)
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o666)
		if err != nil {
			return fmt.Errorf("creating /dev/%s: %w", name, err)
		}
		f.Close()
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", name, err)
		}
	}
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("creating /dev/%s: %w", name, err)
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return fmt.Errorf("creating /dev/shm: %w", err)
	}
	if err := unix.Mount("tmpfs", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mounting /dev/shm: %w", err)
	}
	pts := filepath.Join(dev, "pts")
	if err := os.Mkdir(pts, 0o755); err == nil {
		if unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") == nil {
			_ = os.Symlink("pts/ptmx", filepath.Join(dev, "ptmx"))
		}
	}
	return nil
}
