package agent

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/proxy"
	"github.com/cowork-vmm/cowork-vmm/guest/timerslack"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// launch is one spawn on its way to a running process: what spawn decided
// and what it opened, which abort releases if the process does not start.
type launch struct {
	sp   protocol.SpawnParams
	cwd  string
	path string // the command, resolved
	argv []string
	iso  *isolation // nil unless Options.IsolateSessions
	env  []string

	// The process's ends of its pipes (closed once it has them) and ours.
	childStdin, childStdout, childStderr *os.File
	stdin, stdout, stderr                *os.File

	egress   *proxy.Namespaced // nil without Options.Egress
	cgroup   *spawnCgroup      // nil without spawn cgroups
	endpoint *endpoint         // its guest-request socket; nil if none
	proc     *process

	// errNotStarted is set when the fork step refused the spawn itself
	// (its error is then the whole story).
	errNotStarted error
}

// spawn starts one process: isolated (Options.IsolateSessions, see
// isolate.go), sandboxed in a fresh user and mount namespace (the process
// backend, see mounter.sandboxSpawns), or plainly (unit tests); in a cgroup
// of its own where there are spawn cgroups (cgroup.go); with a
// guest-request socket (guestrequest.go).
func (t *processTable) spawn(sp protocol.SpawnParams) error {
	l, err := t.prepare(sp)
	if err != nil {
		return err
	}
	if err := t.open(l); err != nil {
		t.abort(l)
		return err
	}
	attr, err := t.procAttr(l)
	if err != nil {
		t.abort(l)
		return err
	}
	if err := t.start(l, attr); err != nil {
		t.abort(l)
		if l.errNotStarted != nil {
			return l.errNotStarted
		}
		return fmt.Errorf("spawn %s: starting %s: %w", sp.ID, l.path, err)
	}
	closeAll(l.childStdin, l.childStdout, l.childStderr)
	if l.endpoint != nil {
		go l.endpoint.serve()
	}
	if l.iso != nil {
		t.a.log.Info("process started", "id", sp.ID, "pid", l.proc.pid, "command", sp.Command, "session", l.iso.session, "uid", l.iso.id.uid)
	} else {
		t.a.log.Info("process started", "id", sp.ID, "pid", l.proc.pid, "command", sp.Command, "session", sp.Session)
	}
	go t.run(l.proc)
	return nil
}

// prepare checks a spawn and decides what it runs, where, and (isolated)
// as whom.
func (t *processTable) prepare(sp protocol.SpawnParams) (*launch, error) {
	if sp.ID == "" || len(sp.ID) > maxProcessIDLen {
		return nil, fmt.Errorf("spawn needs a process id of 1 to %d bytes", maxProcessIDLen)
	}
	if sp.Command == "" {
		return nil, fmt.Errorf("spawn %s: no command given", sp.ID)
	}
	if w := sp.OutputWindow; w != 0 && (w < protocol.MinOutputWindow || w > protocol.MaxOutputWindow) {
		return nil, fmt.Errorf("spawn %s: output window of %d bytes, want %d to %d", sp.ID, w, protocol.MinOutputWindow, protocol.MaxOutputWindow)
	}
	l := &launch{sp: sp, cwd: sp.Cwd, env: sp.Env, argv: append([]string{sp.Command}, sp.Args...)}
	if l.cwd == "" {
		l.cwd = "/"
	}
	if st, err := os.Stat(l.cwd); err != nil {
		return nil, fmt.Errorf("spawn %s: working directory: %w", sp.ID, err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("spawn %s: working directory %s is not a directory", sp.ID, l.cwd)
	}
	var err error
	if l.path, err = lookPath(sp.Command, sp.Env, l.cwd); err != nil {
		return nil, fmt.Errorf("spawn %s: %w", sp.ID, err)
	}
	if t.a.mnt.isolate {
		if l.iso, err = t.isolationFor(sp); err != nil {
			return nil, fmt.Errorf("spawn %s: %w", sp.ID, err)
		}
	}
	return l, nil
}

// open makes the process's pipes, cgroup, network sandbox and (unless
// isolated, whose socket is made in its namespace) guest-request socket,
// and completes its environment.
func (t *processTable) open(l *launch) error {
	var err error
	if !l.isSudo() { // a sudo command has its caller's descriptors
		for _, p := range []struct{ r, w **os.File }{{&l.childStdin, &l.stdin}, {&l.stdout, &l.childStdout}, {&l.stderr, &l.childStderr}} {
			if *p.r, *p.w, err = os.Pipe(); err != nil {
				return fmt.Errorf("spawn %s: pipes: %w", l.sp.ID, err)
			}
		}
	}
	if l.iso != nil {
		l.env = withToolDir(l.env)
	}
	if l.cgroup, err = t.a.cgroups.create(); err != nil {
		return fmt.Errorf("spawn %s: %w", l.sp.ID, err)
	}
	if t.a.opts.Egress != nil {
		// Fail closed: a spawn that cannot be confined to its proxy does
		// not run.
		l.egress, err = proxy.NewNamespaced(proxy.Config{SpawnID: l.sp.ID, Token: l.sp.EgressToken, Dial: t.a.opts.Egress, Logger: t.a.log})
		if err != nil {
			return fmt.Errorf("spawn %s: network sandbox: %w", l.sp.ID, err)
		}
		l.env = proxy.MergeEnv(l.env, l.egress.URL())
	}
	socket := guestRequestSocket
	if l.iso == nil {
		socket = filepath.Join(t.a.opts.RunDir, "guest-request-"+strconv.FormatUint(t.seq.Add(1), 10)+".sock")
		if l.endpoint, err = t.a.requests.listen(l.sp.ID, socket, true); err != nil {
			t.a.log.Warn("the process gets no guest-request socket", "id", l.sp.ID, "err", err)
			return nil
		}
	}
	l.env = setEnv(l.env, protocol.GuestRequestSocketEnv, socket)
	return nil
}

// isSudo says whether l is a sudo command (sudo.go), whose standard
// descriptors are its caller's, passed in childStdin… (no pipes of ours).
func (l *launch) isSudo() bool { return l.iso != nil && l.iso.root }

// ownPipes are the process's ends of the pipes the agent made for it (none
// for a sudo command).
func (l *launch) ownPipes() []*os.File {
	if l.isSudo() {
		return nil
	}
	return []*os.File{l.childStdin, l.childStdout, l.childStderr}
}

// withToolDir returns env with the guest tool's directory (sudo) at the
// end of its PATH, if it has one without it.
func withToolDir(env []string) []string {
	dir := path.Dir(SudoToolPath)
	for i, kv := range env {
		v, ok := strings.CutPrefix(kv, "PATH=")
		if !ok {
			continue
		}
		if slices.Contains(filepath.SplitList(v), dir) {
			return env
		}
		out := slices.Clone(env)
		out[i] = kv + ":" + dir
		return out
	}
	return env
}

// setEnv returns env with key set to value, replacing what it had.
func setEnv(env []string, key, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+value)
}

// procAttr is the fork's attributes: the process's namespaces, ids and
// cgroup, its working directory, environment and pipes.
func (t *processTable) procAttr(l *launch) (*syscall.ProcAttr, error) {
	sys := &syscall.SysProcAttr{Setpgid: true}
	switch {
	case l.iso != nil:
		sys = l.iso.sysProcAttr()
		// The pipes are the process's, so that it may reopen them
		// (/dev/stdout is /proc/self/fd/1, a pipe of mode 0600); a sudo
		// command's are its caller's own.
		for _, f := range l.ownPipes() {
			if err := unix.Fchown(int(f.Fd()), int(l.iso.id.uid), int(l.iso.id.gid)); err != nil {
				return nil, fmt.Errorf("spawn %s: handing its pipes over: %w", l.sp.ID, err)
			}
		}
	case t.a.mnt.sandboxSpawns():
		// A user namespace nested in ours: the process is root in it but has
		// no capability over the agent's namespaces, and the mounts it
		// inherits are locked (the cover over the host root cannot be lifted).
		sys.Cloneflags = unix.CLONE_NEWUSER | unix.CLONE_NEWNS
		sys.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
		sys.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
		sys.GidMappingsEnableSetgroups = false
	}
	if l.cgroup != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, l.cgroup.fd
	}
	attr := &syscall.ProcAttr{
		Dir:   l.cwd,
		Env:   l.env,
		Files: []uintptr{l.childStdin.Fd(), l.childStdout.Fd(), l.childStderr.Fd()},
		Sys:   sys,
	}
	if l.iso != nil {
		// The child's capabilities take effect only with the exec: it
		// inherits its working directory from the thread instead
		// (iso.start).
		attr.Dir = ""
	}
	return attr, nil
}

// start forks the process on a thread that dies after the fork: the
// network namespace's (egress) or one of its own.
func (t *processTable) start(l *launch, attr *syscall.ProcAttr) error {
	l.proc = &process{
		id:         l.sp.ID,
		status:     make(chan unix.WaitStatus, 1),
		stdinQueue: make(chan []byte, 64),
		stdin:      l.stdin,
		stdout:     l.stdout,
		stderr:     l.stderr,
		egress:     l.egress,
		cgroup:     l.cgroup,
		credit:     newOutputCredit(l.sp.OutputWindow),
	}
	fork := func() error { return t.fork(l, attr) }
	if l.egress != nil {
		// Forked on the namespace's thread: the child lives in the
		// spawn's network namespace, where only the proxy listens.
		return l.egress.Start(fork)
	}
	// A thread of its own, thrown away after the fork: the fork step
	// changes it (confine.go, and an isolated spawn's root).
	return onOwnThread(fork)
}

// forkExec is syscall.ForkExec with the kernel's default timer slack for
// the process it starts: the agent's threads have a raised one
// (timerslack.Raise in VMMain), which a child would otherwise inherit.
func forkExec(path string, argv []string, attr *syscall.ProcAttr) (pid int, err error) {
	err = timerslack.WithDefault(func() error {
		pid, err = syscall.ForkExec(path, argv, attr)
		return err
	})
	return pid, err
}

// fork enters an isolated spawn's namespace (and makes its guest-request
// socket there), confines the thread (confine.go), then forks and
// registers the process. The table lock is
// held across the fork so the reaper cannot reap the pid before it is
// registered.
func (t *processTable) fork(l *launch, attr *syscall.ProcAttr) error {
	refuse := func(err error) error {
		l.errNotStarted = fmt.Errorf("spawn %s: %w", l.sp.ID, err)
		return l.errNotStarted
	}
	execPath, execArgv := l.path, l.argv
	if l.iso != nil {
		if err := l.iso.enter(); err != nil {
			return refuse(fmt.Errorf("isolating the process: %w", err))
		}
		ep, err := t.a.requests.listen(l.sp.ID, guestRequestSocket, false)
		if err != nil {
			return refuse(err)
		}
		ep.spawn = &l.sp
		l.endpoint = ep
		if execPath, execArgv, err = l.iso.start(l.cwd, l.path, l.argv); err != nil {
			return refuse(err)
		}
	}
	if err := confineSpawnThread(t.filter); err != nil {
		return refuse(err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing {
		return refuse(errors.New("the guest is shutting down"))
	}
	if _, dup := t.byID[l.sp.ID]; dup {
		return refuse(errors.New("a process with this id is still running"))
	}
	pid, err := forkExec(execPath, execArgv, attr)
	if err != nil {
		return err
	}
	l.proc.pid = pid
	l.proc.endpoint = l.endpoint
	t.byID[l.sp.ID] = l.proc
	t.byPID[pid] = l.proc
	t.wg.Add(1)
	t.a.idle.busy()
	return nil
}

// abort releases what a spawn that did not start had opened.
func (t *processTable) abort(l *launch) {
	closeAll(l.childStdin, l.childStdout, l.childStderr, l.stdin, l.stdout, l.stderr)
	if l.egress != nil {
		l.egress.Close()
	}
	if l.endpoint != nil {
		l.endpoint.close()
	}
	t.a.cgroups.release(l.cgroup)
}

// isolationFor decides an isolated spawn's set-up: what of the agent's
// mounts its session sees, its session's uid and the owners its user
// namespace maps, its user database.
func (t *processTable) isolationFor(sp protocol.SpawnParams) (*isolation, error) {
	session, err := spawnSession(sp.Session)
	if err != nil {
		return nil, err
	}
	binds, owners, err := t.a.mnt.spawnView(session)
	if err != nil {
		return nil, err
	}
	tmp, err := t.a.mnt.sessionTmpFor(session)
	if err != nil {
		return nil, err
	}
	uid := sp.UID
	if err := t.uids.claim(session, uid); err != nil {
		return nil, err
	}
	iso := &isolation{session: session, binds: binds, tmp: tmp, id: identityFor(uid, owners), bootID: t.a.opts.keep.bootIDBytes()}
	home := path.Join(sessionsDir, session)
	if base, err := os.ReadFile("/etc/passwd"); err == nil {
		iso.passwd = withUser(base, fmt.Sprintf("%s:x:%d:%d:Cowork session:%s:/bin/sh\n", spawnUserName, uid, uid, home))
	}
	if base, err := os.ReadFile("/etc/group"); err == nil {
		iso.group = withUser(base, fmt.Sprintf("%s:x:%d:\n", spawnUserName, uid))
	}
	return iso, nil
}

// spawnSession checks SpawnParams.Session for an isolated spawn: the
// helper always names one, a single path component fit for /etc/passwd.
func spawnSession(name string) (string, error) {
	switch {
	case name == "":
		return "", errors.New("no session given: an isolated process needs its session's name (SpawnParams.Session)")
	case name == "." || name == ".." || strings.ContainsAny(name, "/:\n\x00"):
		return "", fmt.Errorf("session name %q is not a single path component", name)
	}
	return name, nil
}
