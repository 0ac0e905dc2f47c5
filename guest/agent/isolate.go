package agent

// Session isolation (Options.IsolateSessions: the VM).
//
// Everything a spawn runs is untrusted, towards the agent and towards every
// other session. With IsolateSessions each spawn is set up, on an OS thread
// of its own that dies after the fork (the spawn's network namespace's
// thread when egress is on), so that it cannot reach the agent or another
// session:
//
//   - Mount namespace: the thread unshares its mount namespace, makes every
//     mount a slave of the agent's, and builds a fresh tmpfs root holding
//     only: the system directories and the other mounts outside /sessions
//     (recursive binds, read-only where the agent's are), its own session's
//     /sessions/<name> (a recursive bind: mounts the agent adds below it
//     later — mountPath — propagate into it), a new /proc mounted
//     hidepid=invisible (processes it may not ptrace are not there: the
//     agent, other sessions), /sys read-only, a /dev of its own (null, zero,
//     full, random, urandom, tty, a new devpts, shm), an empty /tmp, a /run
//     holding only its guest-request socket and the agent's executable
//     (protocol.GuestToolPath), and /etc/passwd and /etc/group with its
//     user added. Its session is SpawnParams.Session, which the helper
//     always names (a spawn without it is refused). Then pivot_root
//     and the agent's tree is detached: other sessions, the roots of the
//     file-sharing devices (virtio-fs or 9p) and the agent's staging
//     directory are not covered up but absent. The root is made read-only. For this the VM's agent leaves the
//     kernel's rootfs for a tmpfs (leaveRootfs: pivot_root refuses the
//     rootfs) and shares its mounts, keeping the staging directory private
//     (setupInPlace).
//   - Credentials: a user namespace of its own (CLONE_NEWUSER at the fork,
//     and a new IPC namespace) in which it runs as its session's uid and gid
//     U — the helper's choice (SpawnParams.UID: protocol.FirstSessionUID
//     and up), the same for every spawn of a session, never 0 — with no
//     supplementary groups,
//     no_new_privs, and three capabilities, ambient: DAC_OVERRIDE,
//     DAC_READ_SEARCH and FOWNER. Another uid than the agent's and no
//     CAP_SYS_PTRACE in the initial user namespace (the agent is also
//     non-dumpable): no ptrace, no /proc/1/mem, environ or fd. Another uid
//     than other sessions': no ptrace or signals between sessions. No
//     CAP_SYS_ADMIN in the initial user namespace: no mount, and neither
//     virtiofs nor 9p can be mounted from a user namespace of its own
//     either. It may create user namespaces (bubblewrap does). The
//     capabilities take effect with the exec, so the thread enters the
//     working directory for the child, and a command the child could not
//     reach by permission bits alone is started through /bin/sh
//     (isolation.start).
//   - Files on virtio-fs or 9p: the host's device (both over the export
//     layer of devices/hostfs) ignores the guest's ids on create, and the
//     guest kernel checks access against the owner it reports. For a
//     session's mounts the helper asks its exports to show what the helper
//     owns on the host (H) as U's (hostfs.ShowOwnedAs), so a session's
//     processes own their own files: permission bits apply as to an
//     owner, also for access(2), which ignores capabilities for a uid
//     other than its namespace's root (git's work-tree checks used it, and
//     failed on files shown as H's). Files of other host users stay
//     theirs. The spawn's user namespace maps, besides U, the owners of its
//     session's mounts (identically; see identityFor): a capability in a
//     user namespace applies to a file whose uid and gid are mapped in it,
//     so the three ambient capabilities still reach the files the host
//     shows as someone else's — while the host still enforces ro and the
//     helper's own permissions. The mapped owner ids are dormant: no
//     process of the spawn can become them (no CAP_SETUID or CAP_SETGID,
//     setgroups denied, nosuid mounts, no_new_privs), even when an owner
//     is 0. Alternatives weighed: running spawns as H makes every session
//     the same uid, free to ptrace the others' processes and reach their
//     mount namespaces through /proc; 9p's access=client|any modes still
//     check the reported owner; running spawns as their namespace's root
//     (access(2) then honours the capabilities) makes programs that
//     refuse root, as the Claude Code CLI does for some modes, refuse.
//   - The writable root (rootdisk.go): with a root disk the system
//     directories are overlays a session may change (pip, npm -g, /opt), so
//     the spawn's user namespace also maps root's ids, dormant like the
//     owners': its capabilities then reach the root-owned files of the
//     overlays (what it creates there is its uid's). Changes to the shared
//     root are seen by every session of the profile: that is what the disk
//     is for. Still not root: no setuid, nothing of the agent in reach; a
//     program that insists on uid 0 (apt-get, dpkg) runs through sudo
//     (sudo.go), as uid 0 of a namespace where 0 is the session's uid.
//   - Egress: unchanged, a network namespace of its own with only loopback
//     and its proxy in it; the proxy, in the agent, holds the spawn's egress
//     token, which never enters the spawn's environment or files.
//
// The process backend does not set IsolateSessions: its agent runs in a user
// namespace that maps one host uid only, so there are no other uids to give
// spawns; there a spawn runs as root of a user namespace nested in the
// agent's, with its mounts locked and no capability over the agent (see the
// mounter comment), but sees every session and shares its uid with every
// other spawn.

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const (
	// sessionsDir holds each session's home, /sessions/<name>.
	sessionsDir = "/sessions"
	// maxMappedOwners bounds the owner ids a spawn's user namespace maps
	// besides its own (the kernel allows 340 lines).
	maxMappedOwners = 8
	// spawnUserName names the spawns' uid in their /etc/passwd.
	spawnUserName = "cowork"
)

// spawnCaps are the ambient capabilities of an isolated spawn, held in its
// own user namespace: enough to use its session's files whatever their
// reported owner, nothing over processes, mounts or ids.
var spawnCaps = []uintptr{unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER}

// ownKernelDirs are the directories an isolated spawn's root gets fresh
// file systems for; the agent's mounts at or below /proc and /sys are not
// carried over.
var ownKernelDirs = []string{"/proc", "/sys"}

// isBelow says whether p is dir or below it.
func isBelow(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// planRoot lists the agent's paths an isolated spawn of session gets in its
// root, each bound recursively at the same path: the system targets and the
// other mounted targets, except what is at or below /sessions (only the
// spawn's own session home, last, if session is set) or the kernel
// directories, and except what lies below another listed path (a recursive
// bind brings it along).
func planRoot(system, mounted []string, session string) []string {
	var cands []string
	for _, t := range slices.Concat(system, mounted) {
		if isBelow(t, sessionsDir) || slices.ContainsFunc(ownKernelDirs, func(d string) bool { return isBelow(t, d) }) {
			continue
		}
		cands = append(cands, t)
	}
	slices.Sort(cands)
	cands = slices.Compact(cands)
	var binds []string
	for _, t := range cands {
		if !slices.ContainsFunc(binds, func(b string) bool { return isBelow(t, b) }) {
			binds = append(binds, t)
		}
	}
	if session != "" {
		binds = append(binds, path.Join(sessionsDir, session))
	}
	return binds
}

// owner is a file's reported uid and gid.
type owner struct{ uid, gid uint32 }

// spawnIdentity is what an isolated spawn runs as, in its user namespace.
type spawnIdentity struct {
	uid, gid       uint32
	uidMap, gidMap []syscall.SysProcIDMap
}

// identityFor maps uid (also the gid) and the first maxMappedOwners owners'
// distinct ids into the spawn's user namespace, each to itself: the
// process runs as uid, and its ambient capabilities apply to files of the
// owners. Ids are mapped to themselves so that what the spawn's `ls -n`
// shows is what the guest kernel and the 9p server say.
func identityFor(uid uint32, owners []owner) spawnIdentity {
	id := spawnIdentity{uid: uid, gid: uid}
	one := func(n uint32) syscall.SysProcIDMap {
		return syscall.SysProcIDMap{ContainerID: int(n), HostID: int(n), Size: 1}
	}
	id.uidMap = []syscall.SysProcIDMap{one(uid)}
	id.gidMap = []syscall.SysProcIDMap{one(uid)}
	for _, o := range owners {
		if len(id.uidMap) <= maxMappedOwners && !slices.Contains(id.uidMap, one(o.uid)) {
			id.uidMap = append(id.uidMap, one(o.uid))
		}
		if len(id.gidMap) <= maxMappedOwners && !slices.Contains(id.gidMap, one(o.gid)) {
			id.gidMap = append(id.gidMap, one(o.gid))
		}
	}
	return id
}

// asRoot is the identity of a sudo command of the session id is for: uid
// and gid 0 of its user namespace, mapped to the session's own ids, with
// the same owners mapped — the kernel's root as rootOwnerAlias, since 0 is
// taken.
func (id spawnIdentity) asRoot() spawnIdentity {
	root := spawnIdentity{uid: 0, gid: 0}
	alias := func(own uint32, maps []syscall.SysProcIDMap) []syscall.SysProcIDMap {
		out := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(own), Size: 1}}
		for _, m := range maps {
			switch {
			case m.HostID == int(own) || m.HostID == rootOwnerAlias:
				continue // the session itself; an owner that would clash
			case m.HostID == 0:
				m.ContainerID = rootOwnerAlias
			}
			out = append(out, m)
		}
		return out
	}
	root.uidMap = alias(id.uid, id.uidMap)
	root.gidMap = alias(id.gid, id.gidMap)
	return root
}

// sessionUIDs records the uid the helper gave each session
// (SpawnParams.UID), for the agent's life: one session keeps one uid, and
// no two sessions share one.
type sessionUIDs struct {
	mu        sync.Mutex
	byName    map[string]uint32
	bySession map[uint32]string
}

// claim checks uid for session: a session uid, the one the session had
// before if any, and no other session's.
func (s *sessionUIDs) claim(session string, uid uint32) error {
	if !protocol.ValidSessionUID(uid) {
		return fmt.Errorf("uid %d of session %q is not a session uid (%d and up)", uid, session, protocol.FirstSessionUID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if had, ok := s.byName[session]; ok && had != uid {
		return fmt.Errorf("session %q runs as uid %d, not %d", session, had, uid)
	}
	if other, ok := s.bySession[uid]; ok && other != session {
		return fmt.Errorf("uid %d is session %q's, not %q's", uid, other, session)
	}
	if s.byName == nil {
		s.byName, s.bySession = make(map[string]uint32), make(map[uint32]string)
	}
	s.byName[session], s.bySession[uid] = uid, session
	return nil
}

// withUser returns an /etc/passwd or /etc/group with line added (after a
// newline if base lacks its last one).
func withUser(base []byte, line string) []byte {
	out := slices.Clone(base)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, line...)
}

// isolation is one isolated spawn's set-up, decided in the agent (see
// processTable.isolationFor) and entered on the thread that forks it.
type isolation struct {
	session string
	// root: a sudo command (sudo.go), uid 0 of its namespace, started
	// through the guest tool's root-exec.
	root  bool
	binds []string // agent paths bound at the same path in the new root
	tmp   string   // bound at /tmp (sessiontmp.go); "": a tmpfs of its own
	id    spawnIdentity
	// passwd and group replace /etc/passwd and /etc/group when the root
	// has them (nil: left alone).
	passwd, group []byte
	// bootID replaces the kernel's boot id (nil: left alone).
	bootID []byte
}

// sysProcAttr is the fork's part: the spawn's own user and IPC namespaces,
// its ids and its capabilities.
func (iso *isolation) sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Setpgid:                    true,
		Cloneflags:                 unix.CLONE_NEWUSER | unix.CLONE_NEWIPC,
		UidMappings:                iso.id.uidMap,
		GidMappings:                iso.id.gidMap,
		GidMappingsEnableSetgroups: false,
		Credential:                 &syscall.Credential{Uid: iso.id.uid, Gid: iso.id.gid, NoSetGroups: true},
		AmbientCaps:                iso.ambientCaps(),
	}
}

// ambientCaps: a spawn's, none for root (its capabilities come with uid 0,
// narrowed by root-exec).
func (iso *isolation) ambientCaps() []uintptr {
	if iso.root {
		return nil
	}
	return spawnCaps
}

// onOwnThread runs fn on an OS thread that is never reused: fn may change
// what belongs to the thread (its mount namespace and root, no_new_privs,
// groups), and a child forked there inherits it; the thread ends with fn.
func onOwnThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		done <- fn()
	}()
	return <-done
}

// enter sets up the calling thread (locked, thrown away after the fork) for
// the spawn: its mount namespace and root (see the comment at the top of
// this file), no supplementary groups, no_new_privs.
func (iso *isolation) enter() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("a mount namespace for the process: %w", err)
	}
	// Mounts the agent makes still arrive; nothing made here goes back.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making the process's mounts slaves of the agent's: %w", err)
	}
	// The session's /tmp lies in the staging directory, which the root
	// is about to cover: held open, it is bound through its descriptor.
	tmp, err := openSessionTmp(iso.tmp)
	if err != nil {
		return err
	}
	if tmp != nil {
		defer tmp.Close()
	}
	root := stagingDir
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("the process's root mount point: %w", err)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("the process's root: %w", err)
	}
	if err := buildSpawnRoot(root, iso, tmp); err != nil {
		return err
	}
	old := filepath.Join(root, ".old")
	if err := os.Mkdir(old, 0o700); err != nil {
		return fmt.Errorf("the process's root: %w", err)
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivoting into the process's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering the process's root: %w", err)
	}
	if err := unix.Unmount("/.old", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the agent's mounts from the process's root: %w", err)
	}
	if err := os.Remove("/.old"); err != nil {
		return fmt.Errorf("the process's root: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("making the process's root read-only: %w", err)
	}
	// This thread's groups only (not the agent's: no AllThreadsSyscall).
	if _, _, errno := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); errno != 0 {
		return fmt.Errorf("dropping supplementary groups: %w", errno)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	return nil
}

// execShell runs an isolated spawn's command when the process could not
// reach it by itself (see isolation.start).
const execShell = "/bin/sh"

// start finishes the thread for the fork, in the spawn's root: it enters
// the working directory, which the child inherits, and returns what to
// exec. The child's capabilities become effective only with its exec (the
// fork sets its uid first, which clears them until then), so a command
// whose path it cannot search by the permission bits alone — one in its
// session's home, which the helper creates 0700 — is started through
// execShell: `sh -c 'exec "$0" "$@"' path args...` execs it once the
// capabilities are there (its argv[0] is then the path).
func (iso *isolation) start(cwd, path string, argv []string) (string, []string, error) {
	if err := unix.Chdir(cwd); err != nil {
		return "", nil, fmt.Errorf("working directory %s (outside the process's session?): %w", cwd, err)
	}
	if iso.root {
		return protocol.GuestToolPath, append([]string{protocol.GuestToolPath, "root-exec", path}, argv...), nil
	}
	if searchableByAll(path) {
		return path, argv, nil
	}
	if !searchableByAll(execShell) {
		return "", nil, fmt.Errorf("command %s is out of the process's reach before it starts, and there is no %s to start it through", path, execShell)
	}
	return execShell, append([]string{execShell, "-c", `exec "$0" "$@"`, path}, argv[1:]...), nil
}

// searchableByAll says whether every directory above p lets anyone search
// it, so that a process without capabilities can reach p.
func searchableByAll(p string) bool {
	for dir := filepath.Dir(p); ; dir = filepath.Dir(dir) {
		st, err := os.Stat(dir)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		if dir == "/" {
			return true
		}
	}
}

// openSessionTmp opens the session's /tmp directory dir (O_PATH, in the
// thread's new mount namespace, where a bind may take it from); nil when
// dir is "" (a tmpfs of its own).
func openSessionTmp(dir string) (*os.File, error) {
	if dir == "" {
		return nil, nil
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("the session's /tmp: %w", err)
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// mountSpawnTmp gives the process's root its /tmp at target: the
// session's directory shared, when there is one, else a tmpfs of its own.
func mountSpawnTmp(target string, shared *os.File) error {
	if shared == nil {
		if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return fmt.Errorf("mounting the process's /tmp: %w", err)
		}
		return nil
	}
	src := fmt.Sprintf("/proc/self/fd/%d", shared.Fd())
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the session's /tmp: %w", err)
	}
	return nil
}

// buildSpawnRoot fills the new root at root: fresh kernel file systems
// first (tmp, when not nil, is the session's /tmp), then the binds (which
// may land on them, e.g. below /tmp), then the user database.
func buildSpawnRoot(root string, iso *isolation, tmp *os.File) error {
	at := func(p string) string { return filepath.Join(root, p) }
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"tmp", 0o1777}, {"run", 0o755}, {"sessions", 0o755}} {
		if err := os.Mkdir(at(d.name), d.mode); err != nil {
			return fmt.Errorf("creating /%s in the process's root: %w", d.name, err)
		}
		if err := os.Chmod(at(d.name), d.mode); err != nil { // past the umask
			return fmt.Errorf("creating /%s in the process's root: %w", d.name, err)
		}
	}
	if err := unix.Mount("proc", at("proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible"); err != nil {
		return fmt.Errorf("mounting the process's /proc: %w", err)
	}
	if _, err := os.Stat("/sys/kernel"); err == nil {
		if err := bindOnto("/sys", at("sys"), true, "/sys"); err != nil {
			return err
		}
	}
	if err := setupDev(at("dev"), append(slices.Clone(devNodes), ttyNode)); err != nil {
		return err
	}
	if err := mountSpawnTmp(at("tmp"), tmp); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", at("run"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mounting the process's /run: %w", err)
	}
	for _, b := range iso.binds {
		if err := bindInto(root, b); err != nil {
			return err
		}
	}
	if st, err := os.Lstat(at(hostSudoPath)); err == nil && st.Mode().IsRegular() {
		// Set-uid cannot work here: the guest tool's sudo takes its place.
		if err := bindOnto(protocol.GuestToolPath, at(hostSudoPath), true, "sudo"); err != nil {
			return err
		}
	}
	for name, content := range map[string][]byte{"/etc/passwd": iso.passwd, "/etc/group": iso.group, bootIDFile: iso.bootID} {
		if err := replaceFile(root, name, content); err != nil {
			return err
		}
	}
	return nil
}

// bootIDFile is the kernel's boot id, which a resumed guest's spawns see
// replaced (keptState.bootID).
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// replaceFile shows content at name, a regular file of the new root at
// root, read-only, to the spawn: written into the root, bound over the
// file (the read-only /etc copy, a /proc file), and unlinked (the bind
// keeps it). Nothing when content is nil or there is no such file.
func replaceFile(root, name string, content []byte) error {
	if content == nil {
		return nil
	}
	at := filepath.Join(root, name)
	if st, err := os.Lstat(at); err != nil || !st.Mode().IsRegular() {
		return nil
	}
	tmp := filepath.Join(root, ".cowork-"+filepath.Base(name))
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		return fmt.Errorf("writing the process's %s: %w", name, err)
	}
	err := bindOnto(tmp, at, true, name)
	os.Remove(tmp)
	return err
}

// bindInto binds the agent's p recursively at the same path below root: a
// symlink is copied, a file or directory gets a mount point made for it
// (walked beneath "/" as every mount point is).
func bindInto(root, p string) error {
	st, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil // unmounted meanwhile
	}
	if err != nil {
		return fmt.Errorf("%s for the process's root: %w", p, err)
	}
	err = withRoot(func(top int) error {
		target := filepath.Join(root, p)
		dir, err := walkDir(top, path.Dir(target), 0o755)
		if err != nil {
			return err
		}
		defer dir.close()
		name := path.Base(target)
		var fd int
		switch {
		case st.Mode()&os.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err == nil {
				err = unix.Symlinkat(link, dir.fd, name)
			}
			return err
		case st.IsDir():
			fd, err = makeDir(dir.fd, name, 0o755)
		default:
			fd, err = makeFile(dir.fd, name)
		}
		if err != nil {
			return err
		}
		dst := mountPoint{fd: fd, path: target}
		defer dst.close()
		return bindPath(p, dst, false, p)
	})
	if err != nil {
		return fmt.Errorf("%s for the process's root: %w", p, err)
	}
	return nil
}
