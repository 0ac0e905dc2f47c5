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
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc"
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
	// keep, when set, is what outlives this Run in a guest that may be
	// suspended (the VM's; suspend.go): the root setup made, which a
	// resumed guest's next Run goes on with. nil: Run owns its root and
	// refuses suspend.
	keep *keptState
	// DropCachesWhenIdle, when set, drops the guest kernel's clean page
	// cache once no process has run for that long (idle.go; the VM).
	DropCachesWhenIdle time.Duration
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

	server *agentrpc.Server // the agent channel

	procs    *processTable
	idle     *idleDropper // nil: the page cache is left alone
	mnt      *mounter
	requests *guestRequests // guest requests waiting for the helper
	cgroups  *cgroups

	// ended is closed once a final request (shutdown or suspend) is
	// served; endedWith is what Run then returns.
	endOnce   sync.Once
	ended     chan struct{}
	endedWith error

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
		opts:  opts,
		log:   opts.Logger,
		ended: make(chan struct{}),
	}
	a.server = agentrpc.NewServer(conn, a.methods(), agentrpc.ServerOptions{
		Logger: opts.Logger, Final: []string{protocol.AgentMethodShutdown, protocol.AgentMethodSuspend}})
	a.procs = newProcessTable(a)
	if opts.DropCachesWhenIdle > 0 {
		a.idle = &idleDropper{delay: opts.DropCachesWhenIdle, drop: dropPageCache, log: a.log}
		defer a.idle.busy()
	}
	a.mnt = opts.keep.mounter(a.log, opts.IsolateSessions)
	if opts.keep == nil {
		defer a.mnt.close() // kept ones live on in the suspended guest
	}
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

	if err := a.server.SendHello(protocol.AgentHello{
		Version: protocol.AgentProtocolVersion,
		Kernel:  kernelRelease(),
		PID:     os.Getpid(),
	}); err != nil {
		a.procs.terminateAll(opts.ShutdownGrace)
		return fmt.Errorf("agent: sending hello: %w", err)
	}
	a.helloTook = time.Since(began)
	a.log.Info("agent connected to the helper", "pid", os.Getpid())

	readErr := a.server.Serve(ctx)

	select {
	case <-a.ended:
		return a.endedWith
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

// handleShutdown ends every process; the server then replies and ends
// (shutdown is its Final method). Params are optional.
func (a *agent) handleShutdown(_ context.Context, raw json.RawMessage) (any, error) {
	grace, err := a.graceOf(raw, protocol.AgentMethodShutdown)
	if err != nil {
		return nil, err
	}
	a.log.Info("shutting down: ending every process", "grace", grace)
	a.procs.terminateAll(grace)
	if err := a.mnt.syncRootDisk(); err != nil {
		a.log.Warn("shutting down: the root disk's last writes may be lost", "err", err)
	}
	a.end(ErrShutdown)
	return nil, nil
}

// graceOf reads the grace period of a shutdown's or suspend's params
// (ShutdownParams, SuspendParams; optional): Options.ShutdownGrace when
// absent or out of bounds.
func (a *agent) graceOf(raw json.RawMessage, method string) (time.Duration, error) {
	var p protocol.ShutdownParams
	if len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &p); err != nil {
			return 0, fmt.Errorf("invalid %s params: %w", method, err)
		}
	}
	grace := time.Duration(p.GraceMillis) * time.Millisecond
	if grace <= 0 || grace > 5*time.Minute {
		grace = a.opts.ShutdownGrace
	}
	return grace, nil
}

// end records that a final request was served: Run returns err once its
// reply is written.
func (a *agent) end(err error) {
	a.endOnce.Do(func() { a.endedWith = err; close(a.ended) })
}

// methods are the requests the agent serves (protocol/agent.go).
func (a *agent) methods() map[string]agentrpc.Handler {
	return map[string]agentrpc.Handler{
		protocol.AgentMethodPing:     func(context.Context, json.RawMessage) (any, error) { return nil, nil },
		protocol.AgentMethodShutdown: a.handleShutdown,
		protocol.AgentMethodSuspend:  a.handleSuspend,
		protocol.AgentMethodSetup: agentrpc.Handle(func(_ context.Context, p protocol.SetupParams) (*protocol.SetupResult, error) {
			return a.setup(p)
		}),
		protocol.AgentMethodResume: agentrpc.Handle(func(_ context.Context, p protocol.ResumeParams) (*protocol.SetupResult, error) {
			return a.resume(p)
		}),
		protocol.AgentMethodMount: agentrpc.HandleNoResult(func(_ context.Context, p protocol.MountParams) error {
			return a.mnt.mount(p.Mount)
		}),
		protocol.AgentMethodSpawn: agentrpc.HandleNoResult(func(_ context.Context, p protocol.SpawnParams) error {
			return a.procs.spawn(p)
		}),
		protocol.AgentMethodStdin: agentrpc.HandleNoResult(func(_ context.Context, p protocol.StdinParams) error {
			if err := a.procs.stdin(p.ID, []byte(p.Data)); err != nil || !p.EOF {
				return err
			}
			return a.procs.endStdin(p.ID)
		}),
		protocol.AgentMethodKill: agentrpc.HandleNoResult(func(_ context.Context, p protocol.KillParams) error {
			return a.procs.kill(p.ID, p.Signal)
		}),
		protocol.AgentMethodCredit: agentrpc.HandleNoResult(func(_ context.Context, p protocol.CreditParams) error {
			return a.procs.credit(p)
		}),
		protocol.AgentMethodUnmount: agentrpc.HandleNoResult(func(_ context.Context, p protocol.UnmountParams) error {
			return a.mnt.unmount(p.Target)
		}),
		protocol.AgentMethodPruneTmp: agentrpc.Handle(func(_ context.Context, p protocol.PruneTmpParams) (protocol.PruneTmpResult, error) {
			return a.mnt.pruneTmp(p)
		}),
		protocol.AgentMethodGuestResponse: agentrpc.HandleNoResult(func(_ context.Context, p protocol.GuestResponseParams) error {
			return a.requests.answer(p)
		}),
		protocol.AgentMethodReadFile: agentrpc.Handle(func(_ context.Context, p protocol.ReadFileParams) (*protocol.ReadFileResult, error) {
			content, err := readSessionFile(a.opts.SessionsDir, p.Path)
			if err != nil {
				return nil, err
			}
			return &protocol.ReadFileResult{Content: content}, nil
		}),
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
	if p.ImageRoot != nil {
		if err := writeAptSandboxConf(imageDir); err != nil {
			a.log.Warn("apt may try to drop privileges sudo does not have", "err", err)
		}
		if a.mnt.isolate {
			if err := a.mnt.startImageSessionTmp(); err != nil {
				a.log.Warn("sessions' /tmp stays in guest RAM", "err", err)
			}
		}
		result.SessionTmp = a.mnt.hasSessionTmp()
	}
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
	a.opts.keep.setUp(*result)
	return result, nil
}

// emit sends one event; a failure means the helper is gone and is only logged
// (the read loop notices and ends Run).
func (a *agent) emit(ev protocol.Event) {
	if err := a.server.Emit(ev); err != nil {
		a.log.Debug("could not send an event", "type", ev.Type, "id", ev.ID, "err", err)
	}
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
