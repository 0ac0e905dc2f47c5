package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Spawn ids and the session a run uses.
const (
	benchProfile = "cowork-vmm-bench"
	benchSession = "bench"
	trueID       = "bench-true"
	echoID       = "bench-echo"
	echoText     = "cowork-bench"
)

// Polling intervals: finer than the desktop client's (several times a
// second) so the figures have millisecond resolution; isGuestConnected is
// polled only after the agent has dialed (see helperProcess.boot).
const (
	socketPoll    = 500 * time.Microsecond
	connectedPoll = 2 * time.Millisecond
	goneTimeout   = 30 * time.Second
	exitTimeout   = 20 * time.Second
)

// helperRun is one start of the helper binary, driven like the client.
type helperRun struct {
	Binary  string
	Backend string // COWORK_VMM_BACKEND
	Kernel  string // COWORK_VMM_KERNEL, when set
	MemMiB  int
	Dir     string        // private work directory of this run
	Timeout time.Duration // bound on the boot (startVM → connected)
	// DataDir, when set, is the helper's XDG_DATA_HOME, shared by the runs
	// of one system so that the profile's root disk is formatted once, at
	// the first, as a user's is; empty: a fresh one below Dir.
	DataDir string
	// SnapshotCache, when set, is the helper's XDG_CACHE_HOME, where the
	// kvm backend keeps the snapshot of its warm starts (suspend off:
	// each start restores the first-boot snapshot); empty: warm starts
	// are off (COWORK_VMM_SNAPSHOT=off), every start is cold.
	SnapshotCache string
	// Progress, when set, is told what the run is doing.
	Progress func(step string)
	// Meter, when set, samples the helper's work at the instants of the
	// start (runResult.Work).
	Meter *WorkMeter
}

// runResult is what one helper run measured.
type runResult struct {
	Phases map[string]time.Duration
	Memory *Memory
	// Work is the VMM's work per boot operation (WorkBoot …), when
	// metered.
	Work map[string]Work
}

// run starts the helper, boots a guest, runs /bin/true and echo, stops
// the guest and the helper, and returns the phase durations.
func (h helperRun) run(ctx context.Context) (runResult, error) {
	p, err := h.start()
	if err != nil {
		return runResult{}, err
	}
	defer p.close()

	bootCtx, cancel := context.WithTimeout(ctx, h.Timeout)
	defer cancel()
	if err := p.connect(bootCtx); err != nil {
		return p.fail(err)
	}
	h.progress("booting the guest")
	if err := p.boot(bootCtx, h.MemMiB, h.Backend == "kvm"); err != nil {
		return p.fail(err)
	}

	opCtx, opCancel := context.WithTimeout(ctx, time.Minute)
	defer opCancel()
	if err := p.spawnTrueAndEcho(opCtx, h.progress); err != nil {
		return p.fail(err)
	}
	var guestBytes int64
	if h.Backend != "process" {
		guestBytes = int64(h.MemMiB) << 20
	}
	mem, memErr := ReadMemory(p.cmd.Process.Pid, guestBytes)

	h.progress("stopping the guest")
	if err := p.stopGuest(ctx, opCtx); err != nil {
		return p.fail(err)
	}
	return p.finish(mem, memErr)
}

// progress tells h.Progress, when set, what the run is doing.
func (h helperRun) progress(step string) {
	if h.Progress != nil {
		h.Progress(step)
	}
}

// helperProcess is one started helper and the client's connections to it:
// what a run drives and measures, and what it must clean up (close).
type helperProcess struct {
	cmd     *exec.Cmd
	exited  chan error // cmd.Wait's result
	stopped bool
	dataDir string // XDG_DATA_HOME, the bench profile's user data root
	sock    string
	logFile *os.File
	logPath string
	tl      *Timeline
	work    *bootWork // nil: not metered
	// Set by connect.
	events *eventLog
	stream *protocol.EventStream
	pipe   *protocol.PipeClient
}

// start makes the run's directories and starts the helper binary on a
// socket of its own, its output going to helper.log in h.Dir.
func (h helperRun) start() (*helperProcess, error) {
	data := h.DataDir
	if data == "" {
		data = filepath.Join(h.Dir, "data")
	}
	rt := filepath.Join(h.Dir, "rt")
	for _, d := range []string{data, rt} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("bench work directory: %w", err)
		}
	}
	p := &helperProcess{dataDir: data, sock: filepath.Join(rt, "cowork.sock"), logPath: filepath.Join(h.Dir, "helper.log"), tl: NewTimeline()}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		return nil, fmt.Errorf("bench work directory: %w", err)
	}
	p.logFile = logFile

	cmd := exec.Command(h.Binary, "-socket", p.sock)
	cmd.Env = append(os.Environ(), "COWORK_VMM_BACKEND="+h.Backend, "XDG_DATA_HOME="+data, "XDG_RUNTIME_DIR="+rt)
	if h.Kernel != "" {
		cmd.Env = append(cmd.Env, "COWORK_VMM_KERNEL="+h.Kernel)
	}
	if h.SnapshotCache != "" {
		// A warm start restores the first-boot snapshot: the guest a
		// run stops is shut down, not suspended for the next run.
		cmd.Env = append(cmd.Env, "XDG_CACHE_HOME="+h.SnapshotCache, "COWORK_VMM_SUSPEND=off")
	} else {
		cmd.Env = append(cmd.Env, "COWORK_VMM_SNAPSHOT=off")
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the bench
	h.progress("starting the helper")
	p.tl.Mark(MarkExec, time.Now())
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting the helper %s: %w", h.Binary, err)
	}
	p.cmd = cmd
	if h.Meter != nil {
		p.work = newBootWork(*h.Meter, cmd.Process.Pid)
	}
	p.exited = make(chan error, 1)
	go func() { p.exited <- cmd.Wait() }()
	return p, nil
}

// stop ends the helper with SIGTERM (SIGKILL after exitTimeout) and returns
// how it exited; later calls return nil.
func (p *helperProcess) stop() error {
	if p.stopped {
		return nil
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		return err
	case <-time.After(exitTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return errors.New("the helper did not exit within 20 s of SIGTERM; killed")
	}
}

// close closes the client's connections, stops the helper if it still runs
// and closes its log.
func (p *helperProcess) close() {
	if p.pipe != nil {
		p.pipe.Close()
	}
	if p.stream != nil {
		p.stream.Close()
	}
	_ = p.stop()
	p.logFile.Close()
}

// recordEvents adds the events received so far to the timeline.
func (p *helperProcess) recordEvents() {
	if p.events == nil {
		return
	}
	for _, te := range p.events.snapshot() {
		p.tl.OnEvent(te.ev, te.at, trueID, echoID)
	}
}

// fail stops the helper and returns what the run measured before err (a
// boot that reached /init measured the boot even if the agent then
// failed), with the end of the helper's log after err.
func (p *helperProcess) fail(err error) (runResult, error) {
	_ = p.stop()
	p.recordEvents()
	return runResult{Phases: p.tl.Durations(), Work: p.work.ops()}, fmt.Errorf("%w%s", err, logTail(p.logPath))
}

// finish closes the client's connections, stops the helper and returns the
// run's phases, and mem unless memErr.
func (p *helperProcess) finish(mem Memory, memErr error) (runResult, error) {
	p.recordEvents()
	p.pipe.Close()
	p.stream.Close()
	if err := p.stop(); err != nil {
		return runResult{}, fmt.Errorf("stopping the helper: %w%s", err, logTail(p.logPath))
	}
	res := runResult{Phases: p.tl.Durations(), Work: p.work.ops()}
	if memErr == nil {
		res.Memory = &mem
	}
	return res, nil
}

// connect waits for the helper's socket, subscribes to its events, opens
// the client's pipe and configures the bench profile, as the desktop
// client does.
func (p *helperProcess) connect(ctx context.Context) error {
	if err := waitSocket(ctx, p.sock, p.exited); err != nil {
		return err
	}
	p.tl.Mark(MarkSocket, time.Now())
	profile := protocol.SubscribeEventsParams{UserDataName: benchProfile, UserDataRoot: p.dataDir}
	stream, err := protocol.SubscribeEvents(ctx, p.sock, profile)
	if err != nil {
		return err
	}
	p.stream = stream
	p.events = newEventLog()
	p.events.onEvent = func(ev protocol.Event) {
		if ev.Type == protocol.EventStartupStep && ev.Step == stepGuestBoot && ev.Status == protocol.StepCompleted {
			p.work.mark(MarkInit, true)
		}
	}
	go p.events.read(stream)
	pipe, err := protocol.DialPipe(ctx, p.sock)
	if err != nil {
		return err
	}
	p.pipe = pipe
	return p.call(ctx, protocol.MethodConfigure, protocol.ConfigureParams{UserDataName: benchProfile, UserDataRoot: p.dataDir}, nil)
}

// call makes one request on the pipe and decodes its result into result
// (when not nil); a reply without success is an error.
func (p *helperProcess) call(ctx context.Context, method string, params, result any) error {
	resp, err := p.pipe.Call(ctx, method, params)
	if err != nil {
		return err
	}
	if !resp.Success {
		return fmt.Errorf("%s: %s", method, resp.Error)
	}
	if result != nil && len(resp.Result) > 0 {
		if err := json.Unmarshal(resp.Result, result); err != nil {
			return fmt.Errorf("%s: decoding the result: %w", method, err)
		}
	}
	return nil
}

// boot starts the guest with memMiB of memory and waits until its agent
// is connected (for a VM, first until the agent has dialed).
func (p *helperProcess) boot(ctx context.Context, memMiB int, vm bool) error {
	memGB := float64(memMiB) / 1024
	p.work.mark(MarkStartSent, false)
	p.tl.Mark(MarkStartSent, time.Now())
	if err := p.call(ctx, protocol.MethodStartVM, protocol.StartVMParams{MemoryGB: &memGB}, nil); err != nil {
		return err
	}
	p.tl.Mark(MarkStartReply, time.Now())
	if vm {
		// Poll only once the agent has dialed: a 2 ms poll through the whole
		// boot costs the helper and the bench CPU the guest's vCPU would
		// otherwise have (on a one-CPU host it slowed the guest kernel's
		// boot by a fifth), and the qemu peers have no poller to pay for.
		if _, err := p.events.wait(ctx, "the guest agent to dial the helper", func(ev protocol.Event) bool {
			return ev.Type == protocol.EventStartupStep && ev.Step == stepAgentDial && ev.Status == protocol.StepCompleted
		}); err != nil {
			return err
		}
	}
	if err := pollUntil(ctx, "the guest agent to connect", connectedPoll, func(ctx context.Context) (bool, error) {
		var r protocol.IsGuestConnectedResult
		err := p.call(ctx, protocol.MethodIsGuestConnected, nil, &r)
		return r.Connected, err
	}, p.events); err != nil {
		return err
	}
	p.tl.Mark(MarkConnected, time.Now())
	p.work.mark(MarkConnected, true)
	return nil
}

// spawnTrueAndEcho runs /bin/true, then echo, each to its exit, in the
// bench session.
func (p *helperProcess) spawnTrueAndEcho(ctx context.Context, progress func(string)) error {
	progress("spawning /bin/true")
	p.work.mark(MarkSpawnSent, false)
	p.tl.Mark(MarkSpawnSent, time.Now())
	if err := p.call(ctx, protocol.MethodSpawn, protocol.ClientSpawnParams{ID: trueID, Name: benchSession, Command: "/bin/true", Args: []string{}}, nil); err != nil {
		return err
	}
	if _, err := p.events.wait(ctx, "the exit of /bin/true", exitOf(trueID)); err != nil {
		return err
	}
	p.work.mark(MarkExit, true)
	progress("spawning echo")
	p.tl.Mark(MarkEchoSent, time.Now())
	if err := p.call(ctx, protocol.MethodSpawn, protocol.ClientSpawnParams{ID: echoID, Name: benchSession, Command: "/bin/echo", Args: []string{echoText}}, nil); err != nil {
		return err
	}
	if _, err := p.events.wait(ctx, "the output of echo", func(ev protocol.Event) bool {
		return ev.Type == protocol.EventStdout && ev.ID == echoID && ev.Data != ""
	}); err != nil {
		return err
	}
	_, err := p.events.wait(ctx, "the exit of echo", exitOf(echoID))
	return err
}

// exitOf matches the exit event of the process id.
func exitOf(id string) func(protocol.Event) bool {
	return func(ev protocol.Event) bool { return ev.Type == protocol.EventExit && ev.ID == id }
}

// stopGuest asks the helper to stop the guest (within opCtx) and waits, at
// most goneTimeout, until the helper says it no longer runs.
func (p *helperProcess) stopGuest(ctx, opCtx context.Context) error {
	p.tl.Mark(MarkStopSent, time.Now())
	if err := p.call(opCtx, protocol.MethodStopVM, nil, nil); err != nil {
		return err
	}
	goneCtx, goneCancel := context.WithTimeout(ctx, goneTimeout)
	defer goneCancel()
	if err := pollUntil(goneCtx, "the guest to stop", connectedPoll, func(ctx context.Context) (bool, error) {
		var r protocol.IsRunningResult
		err := p.call(ctx, protocol.MethodIsRunning, nil, &r)
		return !r.Running, err
	}, nil); err != nil {
		return err
	}
	p.tl.Mark(MarkGone, time.Now())
	return nil
}

// waitSocket polls until the helper's socket accepts a connection, or the
// helper exits.
func waitSocket(ctx context.Context, sock string, exited <-chan error) error {
	for {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the helper exited before binding its socket: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("the helper did not bind %s: %w", sock, ctx.Err())
		case <-time.After(socketPoll):
		}
	}
}

// pollUntil calls check every interval until it returns true. With events
// set, a fatal error event ends the wait early with its message.
func pollUntil(ctx context.Context, what string, interval time.Duration, check func(context.Context) (bool, error), events *eventLog) error {
	for {
		ok, err := check(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if events != nil {
			for _, te := range events.snapshot() {
				if te.ev.Type == protocol.EventError && te.ev.Fatal != nil && *te.ev.Fatal {
					return fmt.Errorf("waiting for %s: the helper reported: %s", what, te.ev.Message)
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(interval):
		}
	}
}

// logTail returns the end of a log file, formatted to follow an error.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return "\nlast lines of " + path + ":\n  " + strings.Join(lines, "\n  ")
}

// setupBreakdownMsg is the helper's log record timing the guest's set-up
// step by step (helper/lifecycle.go setUpRoot).
const setupBreakdownMsg = `msg="guest root set up"`

// setupBreakdown returns the attributes of the helper log's set-up record
// (share=… setup=… agent.mount:/usr=… …), or "" when it has none.
func setupBreakdown(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(b)) {
		if _, attrs, ok := strings.Cut(line, setupBreakdownMsg); ok {
			return strings.TrimSpace(attrs)
		}
	}
	return ""
}

// SetupStep is one timed step of a guest's set-up, as the helper logs it
// (share, setup, agent.hello, agent.mount:/usr, agent.root_disk.mount …).
type SetupStep struct {
	Name     string
	Duration time.Duration
}

// parseSetupSteps returns the timed steps of a set-up record's attributes
// (setupBreakdown's), in their order; attributes that are not durations
// (profile=…, rootDisk="…") are skipped.
func parseSetupSteps(attrs string) []SetupStep {
	var steps []SetupStep
	for _, field := range strings.Fields(attrs) {
		name, value, ok := strings.Cut(field, "=")
		if !ok || name == "" {
			continue
		}
		if d, err := time.ParseDuration(value); err == nil {
			steps = append(steps, SetupStep{Name: name, Duration: d})
		}
	}
	return steps
}
