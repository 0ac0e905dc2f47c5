package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/proxy"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Defaults for Options fields left zero.
const (
	// DefaultShutdownGrace is how long processes get between SIGTERM and
	// SIGKILL when the connection ends without a shutdown request.
	DefaultShutdownGrace = 2 * time.Second
	// DefaultOutputDrain is how long output is still forwarded after a
	// process has exited while something else (a background child) keeps its
	// stdout or stderr open; then the exit event is sent and the pipes closed.
	DefaultOutputDrain = time.Second
	// maxInFlightRequests bounds concurrently handled requests; the read loop
	// waits when it is reached (back-pressure on the helper).
	maxInFlightRequests = 256
)

// Options tunes Run. The zero value is ready to use.
type Options struct {
	Logger *slog.Logger
	// Subreaper makes the agent the reaper of its processes' orphans when it
	// is not PID 1 (PR_SET_CHILD_SUBREAPER). PID 1 reaps orphans anyway.
	Subreaper bool
	// ShutdownGrace: see DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// OutputDrain: see DefaultOutputDrain.
	OutputDrain time.Duration
	// Egress reaches the helper's egress service (proxy.VSockDialer in the
	// VM, an fdpass.Dialer in the process backend). When set, every spawn
	// runs in a network namespace of its own with only loopback and an HTTP
	// proxy in it (HTTPS_PROXY etc. in its environment) whose connections
	// go through Egress; a spawn whose proxy cannot be made fails (closed).
	// When nil (unit tests of the agent), spawns get no proxy and stay in
	// the agent's network namespace — the behaviour before egress existed.
	Egress proxy.HostDialer
	// IsolateSessions runs each spawn with its session's view only: its
	// own uid per session, user, mount and IPC namespaces, a root holding
	// the system directories and its own session (see isolate.go). It needs
	// the agent to be real root of the initial user namespace, on a root
	// that pivot_root accepts (the VM after leaveRootfs, or after a NewRoot
	// setup), and spawns fail until setup has run.
	IsolateSessions bool
	// RunDir holds the guest-request sockets of spawns that are not
	// isolated (an isolated spawn's is in its own /run); default
	// DefaultRunDir.
	RunDir string
	// CgroupRoot is a cgroup2 mount below which each spawn gets a cgroup of
	// its own, for its exit's oomKillCount (see cgroup.go); "" gives none.
	CgroupRoot string
	// cgroups, when set, are the spawn cgroups prepared ahead below
	// CgroupRoot (VMMain starts them before the snapshot point, so that a
	// restored guest finds them made).
	cgroups *cgroups
	// SessionsDir is where the session homes readFile reads in are
	// (default /sessions; the agent's tests point it elsewhere).
	SessionsDir string
}

// ErrShutdown is returned by Run after a shutdown request was served.
var ErrShutdown = errors.New("agent: shut down on request")

// agent is the state of one Run.
type agent struct {
	opts Options
	log  *slog.Logger

	writeMu sync.Mutex
	conn    io.ReadWriteCloser

	procs    *processTable
	mnt      *mounter
	requests *guestRequests // guest requests waiting for the helper
	cgroups  *cgroups

	shutdownOnce sync.Once
	shutdownDone chan struct{} // closed after a shutdown request is served

	// helloTook is how long Run took to send its hello, reported as
	// setup's first step.
	helloTook time.Duration
}

// Run serves the agent channel on conn until the helper sends shutdown (Run
// then returns ErrShutdown), the connection ends, or ctx is done. Either
// way every spawned process is ended (SIGTERM, SIGKILL after the grace) and
// reaped before Run returns; conn is closed.
//
// Run reaps every child of the calling process (see the package comment):
// do not start children by other means while it runs, and run one at a time.
func Run(ctx context.Context, conn io.ReadWriteCloser, opts Options) error {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = DefaultShutdownGrace
	}
	if opts.OutputDrain <= 0 {
		opts.OutputDrain = DefaultOutputDrain
	}
	if opts.RunDir == "" {
		opts.RunDir = DefaultRunDir
	}
	if opts.SessionsDir == "" {
		opts.SessionsDir = sessionsDir
	}
	if opts.Subreaper && os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			opts.Logger.Warn("cannot become child subreaper; orphans will not be reaped by the agent", "err", err)
		}
	}
	began := time.Now()
	a := &agent{
		opts:         opts,
		log:          opts.Logger,
		conn:         conn,
		shutdownDone: make(chan struct{}),
	}
	a.procs = newProcessTable(a)
	a.mnt = newMounter(a.log, opts.IsolateSessions)
	defer a.mnt.close()
	a.requests = newGuestRequests(a)
	defer a.requests.closeAll()
	a.cgroups = opts.cgroups
	if a.cgroups == nil {
		a.cgroups = newCgroups(a.log, opts.CgroupRoot)
	}

	stopReaper := a.procs.startReaper()
	defer stopReaper()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		conn.Close() // unblocks the read loop
	}()

	if err := a.send(protocol.AgentFrame{Kind: protocol.AgentKindHello, Hello: &protocol.AgentHello{
		Version: protocol.AgentProtocolVersion,
		Kernel:  kernelRelease(),
		PID:     os.Getpid(),
	}}); err != nil {
		a.procs.terminateAll(opts.ShutdownGrace)
		return fmt.Errorf("agent: sending hello: %w", err)
	}
	a.helloTook = time.Since(began)
	a.log.Info("agent connected to the helper", "pid", os.Getpid())

	readErr := a.serve(ctx)

	select {
	case <-a.shutdownDone:
		return ErrShutdown
	default:
	}
	// The connection ended without a shutdown: end everything anyway.
	a.procs.terminateAll(opts.ShutdownGrace)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(readErr, io.EOF) {
		return fmt.Errorf("agent: the helper closed the connection: %w", readErr)
	}
	return fmt.Errorf("agent: reading from the helper: %w", readErr)
}

// serve reads requests until the connection fails or a shutdown is served.
func (a *agent) serve(ctx context.Context) error {
	sem := make(chan struct{}, maxInFlightRequests)
	var wg sync.WaitGroup
	defer wg.Wait()
	frames := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		for {
			body, err := protocol.ReadFrame(a.conn)
			if err != nil {
				readErr <- err
				close(frames)
				return
			}
			select {
			case frames <- body:
			case <-a.shutdownDone:
				// serve has returned; nobody reads frames any more.
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		body, ok := <-frames
		if !ok {
			return <-readErr
		}
		var f protocol.AgentFrame
		if err := json.Unmarshal(body, &f); err != nil {
			a.log.Warn("ignoring an undecodable frame from the helper", "err", err, "bytes", len(body))
			continue
		}
		if f.Kind != protocol.AgentKindRequest || f.ID == 0 {
			a.log.Warn("ignoring a frame that is not a request", "kind", f.Kind, "id", f.ID)
			if f.ID != 0 {
				a.reply(f.ID, nil, fmt.Errorf("agent expects request frames, got kind %q", f.Kind))
			}
			continue
		}
		if f.Method == protocol.AgentMethodShutdown {
			// Served inline: nothing else is read once shutdown starts.
			if a.handleShutdown(f) {
				a.conn.Close()
				return nil
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			result, err := a.handle(f.Method, f.Params)
			a.reply(f.ID, result, err)
		}()
	}
}

// handleShutdown ends every process and replies; it reports whether the
// shutdown happened (false: the request was invalid).
func (a *agent) handleShutdown(f protocol.AgentFrame) bool {
	var p protocol.ShutdownParams
	if len(f.Params) > 0 && string(f.Params) != "null" {
		if err := json.Unmarshal(f.Params, &p); err != nil {
			a.reply(f.ID, nil, fmt.Errorf("invalid shutdown params: %w", err))
			return false
		}
	}
	grace := time.Duration(p.GraceMillis) * time.Millisecond
	if grace <= 0 || grace > 5*time.Minute {
		grace = a.opts.ShutdownGrace
	}
	a.log.Info("shutting down: ending every process", "grace", grace)
	a.procs.terminateAll(grace)
	if err := a.mnt.syncRootDisk(); err != nil {
		a.log.Warn("shutting down: the root disk's last writes may be lost", "err", err)
	}
	a.reply(f.ID, nil, nil)
	a.shutdownOnce.Do(func() { close(a.shutdownDone) })
	return true
}

// handle runs one request and returns its result (nil for none).
func (a *agent) handle(method string, raw json.RawMessage) (any, error) {
	switch method {
	case protocol.AgentMethodPing:
		return nil, nil
	case protocol.AgentMethodSetup:
		var p protocol.SetupParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return a.setup(p)
	case protocol.AgentMethodMount:
		var p protocol.MountParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return nil, a.mnt.mount(p.Mount)
	case protocol.AgentMethodSpawn:
		var p protocol.SpawnParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return nil, a.procs.spawn(p)
	case protocol.AgentMethodStdin:
		var p protocol.StdinParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		if err := a.procs.stdin(p.ID, []byte(p.Data)); err != nil || !p.EOF {
			return nil, err
		}
		return nil, a.procs.endStdin(p.ID)
	case protocol.AgentMethodKill:
		var p protocol.KillParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return nil, a.procs.kill(p.ID, p.Signal)
	case protocol.AgentMethodCredit:
		var p protocol.CreditParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return nil, a.procs.credit(p)
	case protocol.AgentMethodUnmount:
		var p protocol.UnmountParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return nil, a.mnt.unmount(p.Target)
	case protocol.AgentMethodPruneTmp:
		var p protocol.PruneTmpParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return a.mnt.pruneTmp(p)
	case protocol.AgentMethodGuestResponse:
		var p protocol.GuestResponseParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return nil, a.requests.answer(p)
	case protocol.AgentMethodReadFile:
		var p protocol.ReadFileParams
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		content, err := readSessionFile(a.opts.SessionsDir, p.Path)
		if err != nil {
			return nil, err
		}
		return protocol.ReadFileResult{Content: content}, nil
	default:
		return nil, fmt.Errorf("unknown agent method %q", method)
	}
}

// setup lays out the root filesystem, sets the hostname and steps the
// wall clock to the helper's.
func (a *agent) setup(p protocol.SetupParams) (*protocol.SetupResult, error) {
	timer := newStepTimer()
	timer.steps = append(timer.steps, protocol.TimedStep{Name: "hello", Micros: a.helloTook.Microseconds()})
	if err := a.mnt.setup(p, timer); err != nil {
		return nil, err
	}
	if p.ClockUnixNano != 0 {
		a.stepClock(time.Unix(0, p.ClockUnixNano))
		timer.done("clock")
	}
	if p.Hostname != "" {
		if err := unix.Sethostname([]byte(p.Hostname)); err != nil {
			return nil, fmt.Errorf("setting the guest hostname to %q: %w", p.Hostname, err)
		}
	}
	result := &protocol.SetupResult{}
	if p.RootDisk != nil {
		did, err := a.setUpRootDisk(*p.RootDisk, timer)
		if err != nil {
			a.log.Warn("the guest's root stays read-only", "err", err)
			did = "none: " + err.Error()
			timer.done("root_disk.failed")
		}
		result.RootDisk = did
		result.SessionTmp = a.mnt.hasSessionTmp()
	}
	result.Steps = timer.steps
	return result, nil
}

func decodeParams(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return errors.New("missing params")
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("invalid params: %w", err)
	}
	return nil
}

// reply sends the reply to request id.
func (a *agent) reply(id uint64, result any, err error) {
	f := protocol.AgentFrame{Kind: protocol.AgentKindReply, ID: id}
	if err != nil {
		f.Error = err.Error()
	} else if result != nil {
		raw, merr := json.Marshal(result)
		if merr != nil {
			f.Error = fmt.Sprintf("agent: encoding the result: %v", merr)
		} else {
			f.Result = raw
		}
	}
	if serr := a.send(f); serr != nil {
		a.log.Debug("could not send a reply", "id", id, "err", serr)
	}
}

// emit sends one event; a failure means the helper is gone and is only logged
// (the read loop notices and ends Run).
func (a *agent) emit(ev protocol.Event) {
	if err := a.send(protocol.AgentFrame{Kind: protocol.AgentKindEvent, Event: &ev}); err != nil {
		a.log.Debug("could not send an event", "type", ev.Type, "id", ev.ID, "err", err)
	}
}

// send writes one frame; frames from concurrent goroutines never interleave.
func (a *agent) send(f protocol.AgentFrame) error {
	body, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("agent: encoding a frame: %w", err)
	}
	a.writeMu.Lock()
	defer a.writeMu.Unlock()
	return protocol.WriteFrame(a.conn, body)
}

// kernelRelease is uname -r, for the hello.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// readSessionFile reads, for the client's readFile, a regular file of at
// most protocol.MaxReadFileBytes inside a session's home
// (sessions/<name>/...): the only files the client reads. The file is
// resolved beneath the home, so a symlink a session's process planted that
// leads out of it (into another session's home, to /, to /proc magic
// links) is refused; one that stays inside is followed. O_NONBLOCK: opening
// a FIFO must not hang the request.
func readSessionFile(sessions, path string) ([]byte, error) {
	if path == "" || path[0] != '/' {
		return nil, fmt.Errorf("readFile needs an absolute guest path, got %q", path)
	}
	rel, ok := strings.CutPrefix(filepath.Clean(path), sessions+"/")
	name, inHome, _ := strings.Cut(rel, "/")
	if !ok || name == "" || inHome == "" {
		return nil, fmt.Errorf("reading %s: readFile reads only files inside a session's home (%s/<name>/...)", path, sessions)
	}
	homeFd, err := unix.Openat2(unix.AT_FDCWD, filepath.Join(sessions, name), &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return nil, fmt.Errorf("reading %s: the session's home: %w", path, err)
	}
	defer unix.Close(homeFd)
	fd, err := unix.Openat2(homeFd, inHome, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS})
	if errors.Is(err, unix.EXDEV) {
		return nil, fmt.Errorf("reading %s: it leads out of session %s's home (a symlink?), which readFile does not follow", path, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("reading %s: not a regular file (%s)", path, st.Mode().Type())
	}
	if st.Size() > protocol.MaxReadFileBytes {
		return nil, fmt.Errorf("reading %s: the file is %d bytes, more than the %d bytes readFile returns", path, st.Size(), protocol.MaxReadFileBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, protocol.MaxReadFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > protocol.MaxReadFileBytes {
		return nil, fmt.Errorf("reading %s: the file grew past the %d bytes readFile returns", path, protocol.MaxReadFileBytes)
	}
	return data, nil
}

// openNoMagic opens path like open(2) but refuses to follow /proc magic links
// anywhere in it (openat2 RESOLVE_NO_MAGICLINKS; plain open on kernels
// without openat2).
func openNoMagic(path string, flags int) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_NO_MAGICLINKS})
	if errors.Is(err, unix.ENOSYS) {
		return unix.Open(path, flags, 0)
	}
	return fd, err
}

// clockTolerance is how far the guest's wall clock may be from the
// helper's before setup steps it.
const clockTolerance = time.Second

// stepClock sets the wall clock to host when it is off by more than
// clockTolerance: a VM restored from a snapshot wakes at the snapshot's
// time. A failure (no CAP_SYS_TIME) is logged: a wrong clock is no reason
// to refuse the session.
func (a *agent) stepClock(host time.Time) {
	off := time.Until(host)
	if off.Abs() <= clockTolerance {
		return
	}
	ts := unix.NsecToTimespec(host.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		a.log.Warn("cannot step the guest's wall clock to the helper's", "off", off, "err", err)
		return
	}
	a.log.Info("stepped the guest's wall clock to the helper's", "by", off)
}
