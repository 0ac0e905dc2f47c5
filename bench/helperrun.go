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
// polled only after the agent has dialed (see run).
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
	// Progress, when set, is told what the run is doing.
	Progress func(step string)
}

// runResult is what one helper run measured.
type runResult struct {
	Phases map[string]time.Duration
	Memory *Memory
}

// run starts the helper, boots a guest, runs /bin/true and echo, stops
// the guest and the helper, and returns the phase durations.
func (h helperRun) run(ctx context.Context) (runResult, error) {
	progress := h.Progress
	if progress == nil {
		progress = func(string) {}
	}
	data := filepath.Join(h.Dir, "data")
	rt := filepath.Join(h.Dir, "rt")
	for _, d := range []string{data, rt} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return runResult{}, fmt.Errorf("bench work directory: %w", err)
		}
	}
	sock := filepath.Join(rt, "cowork.sock")
	logPath := filepath.Join(h.Dir, "helper.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return runResult{}, fmt.Errorf("bench work directory: %w", err)
	}
	defer logFile.Close()

	cmd := exec.Command(h.Binary, "-socket", sock)
	cmd.Env = append(os.Environ(), "COWORK_VMM_BACKEND="+h.Backend, "XDG_DATA_HOME="+data, "XDG_RUNTIME_DIR="+rt)
	if h.Kernel != "" {
		cmd.Env = append(cmd.Env, "COWORK_VMM_KERNEL="+h.Kernel)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the bench
	tl := NewTimeline()
	progress("starting the helper")
	tl.Mark(MarkExec, time.Now())
	if err := cmd.Start(); err != nil {
		return runResult{}, fmt.Errorf("starting the helper %s: %w", h.Binary, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stopHelper := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(exitTimeout):
			_ = cmd.Process.Kill()
			<-exited
			return errors.New("the helper did not exit within 20 s of SIGTERM; killed")
		}
	}
	defer func() { _ = stopHelper() }()
	var events *eventLog
	// fail keeps what the run measured before it failed (a boot that
	// reached /init measured the boot even if the agent then failed).
	fail := func(err error) (runResult, error) {
		_ = stopHelper()
		if events != nil {
			for _, te := range events.snapshot() {
				tl.OnEvent(te.ev, te.at, trueID, echoID)
			}
		}
		return runResult{Phases: tl.Durations()}, fmt.Errorf("%w%s", err, logTail(logPath))
	}

	bootCtx, cancel := context.WithTimeout(ctx, h.Timeout)
	defer cancel()
	if err := waitSocket(bootCtx, sock, exited); err != nil {
		return fail(err)
	}
	tl.Mark(MarkSocket, time.Now())

	profile := protocol.SubscribeEventsParams{UserDataName: benchProfile, UserDataRoot: data}
	stream, err := protocol.SubscribeEvents(bootCtx, sock, profile)
	if err != nil {
		return fail(err)
	}
	defer stream.Close()
	events = newEventLog()
	go events.read(stream)

	pipe, err := protocol.DialPipe(bootCtx, sock)
	if err != nil {
		return fail(err)
	}
	defer pipe.Close()
	call := func(ctx context.Context, method string, params, result any) error {
		resp, err := pipe.Call(ctx, method, params)
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
	if err := call(bootCtx, protocol.MethodConfigure, protocol.ConfigureParams{UserDataName: benchProfile, UserDataRoot: data}, nil); err != nil {
		return fail(err)
	}

	progress("booting the guest")
	memGB := float64(h.MemMiB) / 1024
	tl.Mark(MarkStartSent, time.Now())
	if err := call(bootCtx, protocol.MethodStartVM, protocol.StartVMParams{MemoryGB: &memGB}, nil); err != nil {
		return fail(err)
	}
	tl.Mark(MarkStartReply, time.Now())
	if h.Backend == "kvm" {
		// Poll only once the agent has dialed: a 2 ms poll through the whole
		// boot costs the helper and the bench CPU the guest's vCPU would
		// otherwise have (on a one-CPU host it slowed the guest kernel's
		// boot by a fifth), and the qemu peers have no poller to pay for.
		if _, err := events.wait(bootCtx, "the guest agent to dial the helper", func(ev protocol.Event) bool {
			return ev.Type == protocol.EventStartupStep && ev.Step == stepAgentDial && ev.Status == protocol.StepCompleted
		}); err != nil {
			return fail(err)
		}
	}
	if err := pollUntil(bootCtx, "the guest agent to connect", connectedPoll, func(ctx context.Context) (bool, error) {
		var r protocol.IsGuestConnectedResult
		err := call(ctx, protocol.MethodIsGuestConnected, nil, &r)
		return r.Connected, err
	}, events); err != nil {
		return fail(err)
	}
	tl.Mark(MarkConnected, time.Now())

	progress("spawning /bin/true")
	opCtx, opCancel := context.WithTimeout(ctx, time.Minute)
	defer opCancel()
	tl.Mark(MarkSpawnSent, time.Now())
	if err := call(opCtx, protocol.MethodSpawn, protocol.ClientSpawnParams{ID: trueID, Name: benchSession, Command: "/bin/true", Args: []string{}}, nil); err != nil {
		return fail(err)
	}
	if _, err := events.wait(opCtx, "the exit of /bin/true", func(ev protocol.Event) bool {
		return ev.Type == protocol.EventExit && ev.ID == trueID
	}); err != nil {
		return fail(err)
	}
	progress("spawning echo")
	tl.Mark(MarkEchoSent, time.Now())
	if err := call(opCtx, protocol.MethodSpawn, protocol.ClientSpawnParams{ID: echoID, Name: benchSession, Command: "/bin/echo", Args: []string{echoText}}, nil); err != nil {
		return fail(err)
	}
	if _, err := events.wait(opCtx, "the output of echo", func(ev protocol.Event) bool {
		return ev.Type == protocol.EventStdout && ev.ID == echoID && ev.Data != ""
	}); err != nil {
		return fail(err)
	}
	if _, err := events.wait(opCtx, "the exit of echo", func(ev protocol.Event) bool {
		return ev.Type == protocol.EventExit && ev.ID == echoID
	}); err != nil {
		return fail(err)
	}

	var guestBytes int64
	if h.Backend != "process" {
		guestBytes = int64(h.MemMiB) << 20
	}
	mem, memErr := ReadMemory(cmd.Process.Pid, guestBytes)

	progress("stopping the guest")
	tl.Mark(MarkStopSent, time.Now())
	if err := call(opCtx, protocol.MethodStopVM, nil, nil); err != nil {
		return fail(err)
	}
	goneCtx, goneCancel := context.WithTimeout(ctx, goneTimeout)
	defer goneCancel()
	if err := pollUntil(goneCtx, "the guest to stop", connectedPoll, func(ctx context.Context) (bool, error) {
		var r protocol.IsRunningResult
		err := call(ctx, protocol.MethodIsRunning, nil, &r)
		return !r.Running, err
	}, nil); err != nil {
		return fail(err)
	}
	tl.Mark(MarkGone, time.Now())

	for _, te := range events.snapshot() {
		tl.OnEvent(te.ev, te.at, trueID, echoID)
	}
	pipe.Close()
	stream.Close()
	if err := stopHelper(); err != nil {
		return runResult{}, fmt.Errorf("stopping the helper: %w%s", err, logTail(logPath))
	}
	res := runResult{Phases: tl.Durations()}
	if memErr == nil {
		res.Memory = &mem
	}
	return res, nil
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
