package agent

// sudo: a session's way to run a command as root (apt-get, dpkg).
//
// An isolated spawn runs as its session's uid U and may not change it: no
// CAP_SETUID, no_new_privs, nosuid mounts, so the host's set-uid sudo
// cannot work there. The guest tool under the name sudo (bound at
// /run/cowork/bin/sudo, which isolated spawns find at the end of their
// PATH, and over the root's /usr/bin/sudo when the host has one) asks the
// agent instead, over the spawn's guest-request socket: one
// protocol.GuestCallSudo call carrying the command and, as SCM_RIGHTS, the
// caller's standard input, output and error. The agent starts the command
// in the caller's session exactly as it starts the session's spawns (a
// fresh root holding the session only, its own network namespace behind
// the session's egress, a cgroup) but in a user namespace where it is uid
// and gid 0 — mapped to the session's own U, so on every file and process
// outside that namespace it is the session and nothing more. The root
// disk's system files belong to the kernel's root; that namespace maps the
// kernel's root too (to rootOwnerAlias, not 0), so the command's
// capabilities reach them as the session's spawns' DAC capabilities do.
// It could become any mapped id with CAP_SETUID, so before the command runs
// the guest tool, exec'd first as `root-exec`, drops every capability but
// sudoCaps from its bounding set: no setuid or setgid (the kernel's root
// stays out of reach — as its euid a process could write sysctls), no
// mounts, no ptrace, no file capabilities. It answers the call with how
// the command ended; a signal the caller gets is passed on, and a caller
// that hangs up (killed) takes the command's process group with it.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const (
	// SudoToolPath is where isolated spawns find the guest tool as sudo.
	SudoToolPath = "/run/cowork/bin/sudo"
	// hostSudoPath is the host's sudo, which the guest tool covers in an
	// isolated spawn's root (set-uid cannot work there).
	hostSudoPath = "/usr/bin/sudo"
	// rootOwnerAlias is the kernel's root in a sudo command's user
	// namespace, where 0 is the session's uid.
	rootOwnerAlias = 65533
	// sudoStdio is how many descriptors a sudo call carries.
	sudoStdio = 3
	// maxSudoSignalFrame bounds a SudoSignal frame's body.
	maxSudoSignalFrame = 256
)

// sudoCaps are the capabilities a sudo command keeps (its bounding set):
// what package managers and their scripts use on files, none over ids,
// mounts or other processes than the command's own.
var sudoCaps = []uintptr{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER,
	unix.CAP_FSETID, unix.CAP_KILL, unix.CAP_NET_BIND_SERVICE, unix.CAP_SYS_CHROOT, unix.CAP_AUDIT_WRITE,
}

// SudoMain is `sudo [-E] [-H] [-n] [-u root] [-s|-i] [--] [CMD [ARGS…]]` in
// the guest: it runs CMD as root (see the top of this file) and exits with
// its status (128+n for a signal); sudo's own failures exit 1.
func SudoMain(args []string, stderr io.Writer) int {
	argv, err := parseSudoArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "sudo: %v\n", err)
		fmt.Fprintln(stderr, "usage: sudo [-E] [-H] [-n] [-u root] [-s | -i] [--] command [args...]")
		return 1
	}
	path, err := exec.LookPath(argv[0])
	if err == nil {
		path, err = filepath.Abs(path)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sudo: %s: command not found\n", argv[0])
		return 1
	}
	if os.Geteuid() == 0 { // root already (the process backend's spawns)
		err := unix.Exec(path, argv, os.Environ())
		fmt.Fprintf(stderr, "sudo: %s: %v\n", path, err)
		return 1
	}
	cwd, err := os.Getwd()
	if err != nil {
		fmt.Fprintf(stderr, "sudo: the working directory: %v\n", err)
		return 1
	}
	res, err := callSudo(os.Getenv(protocol.GuestRequestSocketEnv), protocol.SudoParams{Path: path, Argv: argv, Cwd: cwd, Env: os.Environ()})
	if err != nil {
		fmt.Fprintf(stderr, "sudo: %v\n", err)
		return 1
	}
	if res.ExitCode != nil {
		return *res.ExitCode
	}
	return 128 + res.Signal
}

// parseSudoArgs reads sudo's options (those that make sense here) and
// returns the command to run.
func parseSudoArgs(args []string) ([]string, error) {
	shell := ""
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		opt := args[0]
		args = args[1:]
		switch {
		case opt == "--":
			goto done
		case opt == "-E" || opt == "-H" || opt == "-n" || opt == "-k" || strings.HasPrefix(opt, "--preserve-env"):
			// The environment is always passed on; there is no password.
		case opt == "-u" || opt == "--user":
			if len(args) == 0 {
				return nil, fmt.Errorf("option %s needs a user", opt)
			}
			if args[0] != "root" && args[0] != "0" && args[0] != "#0" {
				return nil, fmt.Errorf("only root can be asked for here, not %q", args[0])
			}
			args = args[1:]
		case opt == "-uroot" || opt == "--user=root":
		case opt == "-s" || opt == "-i":
			shell = os.Getenv("SHELL")
			if shell == "" {
				shell = "/bin/sh"
			}
		default:
			return nil, fmt.Errorf("option %s is not supported here", opt)
		}
	}
done:
	if shell != "" {
		if len(args) == 0 {
			return []string{shell}, nil
		}
		return []string{shell, "-c", strings.Join(args, " ")}, nil
	}
	if len(args) == 0 {
		return nil, errors.New("no command given")
	}
	return args, nil
}

// callSudo makes the sudo call on socket with this process's standard
// descriptors, passes on the signals this process gets, and returns how the
// command ended.
func callSudo(socket string, p protocol.SudoParams) (protocol.SudoResult, error) {
	var res protocol.SudoResult
	if socket == "" {
		return res, fmt.Errorf("no guest-request socket ($%s is not set): sudo works in the processes the helper spawns", protocol.GuestRequestSocketEnv)
	}
	params, err := json.Marshal(p)
	if err != nil {
		return res, err
	}
	c, err := net.Dial("unix", socket)
	if err != nil {
		return res, fmt.Errorf("asking the guest agent: %w", err)
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	call := protocol.GuestCall{Method: protocol.GuestCallSudo, Params: params}
	if err := protocol.WriteJSON(&rightsWriter{conn: conn, rights: unix.UnixRights(0, 1, 2)}, call); err != nil {
		return res, fmt.Errorf("asking the guest agent: %w", err)
	}
	stop := forwardSignals(conn)
	defer stop()
	resp, err := readResponse(conn)
	if err != nil {
		return res, err
	}
	if !resp.Success {
		return res, errors.New(resp.Error)
	}
	if err := json.Unmarshal(resp.Result, &res); err != nil || (res.ExitCode == nil && res.Signal == 0) {
		return res, fmt.Errorf("the guest agent's answer is not a sudo result: %s", resp.Result)
	}
	return res, nil
}

// rightsWriter writes to conn, sending rights (SCM_RIGHTS) with the first
// bytes written.
type rightsWriter struct {
	conn   *net.UnixConn
	rights []byte
}

func (w *rightsWriter) Write(b []byte) (int, error) {
	if w.rights == nil {
		return w.conn.Write(b)
	}
	n, _, err := w.conn.WriteMsgUnix(b, w.rights, nil)
	w.rights = nil
	if err == nil && n < len(b) {
		var more int
		more, err = w.conn.Write(b[n:])
		n += more
	}
	return n, err
}

// forwardSignals sends the signals a terminal or the client sends this
// process on to the command, until stop.
func forwardSignals(conn *net.UnixConn) (stop func()) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGWINCH)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case s := <-sigs:
				_ = protocol.WriteJSON(conn, protocol.SudoSignal{Signal: int(s.(syscall.Signal))})
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
		wg.Wait()
	}
}

// readResponse reads the one Response frame of a guest-request call.
func readResponse(conn net.Conn) (protocol.Response, error) {
	var resp protocol.Response
	body, err := protocol.ReadFrame(conn)
	if errors.Is(err, io.EOF) {
		return resp, errors.New("the guest agent closed the connection without an answer")
	}
	if err != nil {
		return resp, fmt.Errorf("reading the answer: %w", err)
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return resp, fmt.Errorf("the answer is not a response: %w", err)
	}
	return resp, nil
}

// RootExecMain is `root-exec PATH ARGV0 [ARGS…]`, how the agent starts a
// sudo command in its user namespace: it narrows the bounding set to
// sudoCaps, then execs PATH, whose capabilities as uid 0 are then those.
// Its failures exit 127.
func RootExecMain(args []string, stderr io.Writer) int {
	if len(args) < 2 {
		fmt.Fprintln(stderr, "usage: root-exec PATH ARGV0 [ARGS...] (the guest agent's, for sudo)")
		return 127
	}
	runtime.LockOSThread() // the bounding set is the thread's, and so is the exec
	if err := narrowBoundingSet(sudoCaps); err != nil {
		fmt.Fprintf(stderr, "sudo: %v\n", err)
		return 127
	}
	err := unix.Exec(args[0], args[1:], os.Environ())
	fmt.Fprintf(stderr, "sudo: %s: %v\n", args[0], err)
	return 127
}

// narrowBoundingSet drops every capability but keep from the calling
// thread's bounding set (the process is single-threaded in effect: it
// execs next, which keeps only the calling thread).
func narrowBoundingSet(keep []uintptr) error {
	last := uintptr(unix.CAP_LAST_CAP)
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 && n < 64 {
			last = uintptr(n)
		}
	}
	for c := uintptr(0); c <= last; c++ {
		if slices.Contains(keep, c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("dropping capability %d: %w", c, err)
		}
	}
	return nil
}

// readCallWithRights reads one GuestCall frame and the descriptors sent
// with its first bytes (at most sudoStdio are taken; the kernel drops any
// more), which the caller owns and closes.
func readCallWithRights(conn *net.UnixConn) (protocol.GuestCall, []*os.File, error) {
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(sudoStdio*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(hdr[:], oob)
	fds := parseRights(oob[:oobn])
	if err == nil && n == 0 {
		err = io.EOF
	}
	if err != nil {
		return protocol.GuestCall{}, fds, fmt.Errorf("reading the call: %w", err)
	}
	call, err := readGuestCall(io.MultiReader(strings.NewReader(string(hdr[:n])), conn))
	return call, fds, err
}

// parseRights returns the descriptors of the SCM_RIGHTS messages in oob
// (received close-on-exec: Go's ReadMsgUnix asks for it).
func parseRights(oob []byte) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var files []*os.File
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "passed descriptor "+strconv.Itoa(fd)))
		}
	}
	return files
}

// sudo serves a GuestCallSudo call: the command runs as root in the
// calling spawn's session until it ends (see the top of this file).
func (ep *endpoint) sudo(conn *net.UnixConn, call protocol.GuestCall, fds []*os.File) protocol.Response {
	defer closeAll(fds...)
	if ep.spawn == nil {
		return protocol.Response{Error: "sudo runs commands as root only in the VM's isolated sessions (here processes are root of their namespace already)"}
	}
	if len(fds) != sudoStdio {
		return protocol.Response{Error: fmt.Sprintf("a sudo call carries exactly %d descriptors (standard input, output and error), not %d", sudoStdio, len(fds))}
	}
	var p protocol.SudoParams
	if err := json.Unmarshal(call.Params, &p); err != nil {
		return protocol.Response{Error: fmt.Sprintf("the sudo call's params: %v", err)}
	}
	if err := checkSudoParams(p); err != nil {
		return protocol.Response{Error: err.Error()}
	}
	t := ep.r.a.procs
	proc, err := t.startSudo(*ep.spawn, p, [sudoStdio]*os.File(fds))
	if err != nil {
		return protocol.Response{Error: err.Error()}
	}
	go relaySudoSignals(conn, proc)
	res := sudoResult(t.finishSudo(proc))
	b, err := json.Marshal(res)
	if err != nil {
		return protocol.Response{Error: err.Error()}
	}
	return protocol.Response{Success: true, Result: b}
}

// checkSudoParams refuses what no command could be started with.
func checkSudoParams(p protocol.SudoParams) error {
	hasNUL := func(s string) bool { return strings.ContainsRune(s, 0) }
	switch {
	case !filepath.IsAbs(p.Path) || hasNUL(p.Path):
		return fmt.Errorf("sudo: the command %q is not an absolute path", p.Path)
	case len(p.Argv) == 0:
		return errors.New("sudo: no arguments (argv[0] at least)")
	case !filepath.IsAbs(p.Cwd) || hasNUL(p.Cwd):
		return fmt.Errorf("sudo: the working directory %q is not an absolute path", p.Cwd)
	case slices.ContainsFunc(p.Argv, hasNUL) || slices.ContainsFunc(p.Env, hasNUL):
		return errors.New("sudo: an argument or environment entry holds a NUL byte")
	}
	return nil
}

// relaySudoSignals passes the caller's SudoSignal frames on to the
// command's process group; the caller hanging up (or sending what is not
// a signal frame) kills it.
func relaySudoSignals(conn net.Conn, p *process) {
	for {
		body, err := protocol.ReadFrameMax(conn, maxSudoSignalFrame)
		if err != nil {
			if !p.exited.Load() {
				_ = unix.Kill(-p.pid, unix.SIGKILL)
			}
			return
		}
		var s protocol.SudoSignal
		if json.Unmarshal(body, &s) != nil || s.Signal < 1 || s.Signal > 64 {
			continue
		}
		if !p.exited.Load() {
			_ = unix.Kill(-p.pid, unix.Signal(s.Signal))
		}
	}
}

// sudoResult says how a sudo command ended.
func sudoResult(ws unix.WaitStatus) protocol.SudoResult {
	if ws.Signaled() {
		return protocol.SudoResult{Signal: int(ws.Signal())}
	}
	code := ws.ExitStatus()
	return protocol.SudoResult{ExitCode: &code}
}

// startSudo starts a sudo command in the session of the spawn parent
// called from, as that session's spawns are started but as root of its
// own user namespace, with stdio as its standard descriptors (the caller
// still owns and closes them).
func (t *processTable) startSudo(parent protocol.SpawnParams, p protocol.SudoParams, stdio [sudoStdio]*os.File) (*process, error) {
	sp := protocol.SpawnParams{ID: parent.ID + "/sudo-" + strconv.FormatUint(t.seq.Add(1), 10), Session: parent.Session, UID: parent.UID,
		Command: p.Path, Args: p.Argv[1:], Cwd: p.Cwd, Env: p.Env, EgressToken: parent.EgressToken}
	iso, err := t.isolationFor(sp)
	if err != nil {
		return nil, fmt.Errorf("sudo: %w", err)
	}
	iso.root = true
	iso.id = iso.id.asRoot()
	l := &launch{sp: sp, cwd: p.Cwd, path: p.Path, argv: p.Argv, iso: iso, env: p.Env,
		childStdin: stdio[0], childStdout: stdio[1], childStderr: stdio[2]}
	if err := t.open(l); err != nil {
		t.abort(l)
		return nil, fmt.Errorf("sudo: %w", err)
	}
	attr, err := t.procAttr(l)
	if err == nil {
		err = t.start(l, attr)
	}
	if err != nil {
		t.abort(l)
		if l.errNotStarted != nil {
			return nil, l.errNotStarted
		}
		return nil, fmt.Errorf("sudo: starting %s: %w", p.Path, err)
	}
	if l.endpoint != nil {
		go l.endpoint.serve()
	}
	t.a.log.Info("sudo command started", "id", sp.ID, "pid", l.proc.pid, "command", p.Path, "session", iso.session, "uid", iso.id.uidMap[0].HostID)
	return l.proc, nil
}

// finishSudo waits for a sudo command to end, releases what it held and
// returns its status.
func (t *processTable) finishSudo(p *process) unix.WaitStatus {
	defer t.wg.Done()
	ws := <-p.status
	if p.egress != nil {
		p.egress.Close()
	}
	if p.endpoint != nil {
		p.endpoint.close()
	}
	t.a.cgroups.release(p.cgroup)
	t.mu.Lock()
	delete(t.byID, p.id)
	t.mu.Unlock()
	t.a.log.Info("sudo command ended", "id", p.id, "pid", p.pid, "status", int(ws))
	select {
	case t.finished <- struct{}{}:
	default:
	}
	return ws
}
