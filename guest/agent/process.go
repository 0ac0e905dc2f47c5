package agent

import (
	"errors"
	"fmt"
	"os"
	"os/signal"

	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/proxy"
	"github.com/cowork-vmm/cowork-vmm/guest/seccomp"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Output streaming limits.
const (
	// readBufferSize is how much one read from a process's pipe takes.
	readBufferSize = 32 * 1024
	// maxChunkBytes caps the raw bytes in one stdout/stderr event. Even if
	// every byte became a 6-byte JSON escape the frame stays far below
	// protocol.MaxFrameSize.
	maxChunkBytes = protocol.MaxOutputChunkBytes
	// coalesceWindow is how long a chunk waits for more output before it is
	// sent, so a process writing byte by byte does not cause one event per
	// byte.
	coalesceWindow = 5 * time.Millisecond
	// coalesceEnough is the chunk size at which waiting for more output stops
	// paying off: a fast producer's output is sent without delay.
	coalesceEnough = 16 * 1024
	// maxStdinPending bounds stdin bytes queued for a process that is not
	// reading them.
	maxStdinPending = 8 * 1024 * 1024
	// maxDrainAfterExit bounds how long output is still forwarded after a
	// process has exited while it keeps flowing (see waitDrained).
	maxDrainAfterExit = time.Minute
	// killWait bounds how long shutdown waits for exits after SIGKILL.
	killWait = 10 * time.Second
	// maxProcessIDLen bounds a spawn id.
	maxProcessIDLen = 512
)

// process is one spawned process (the leader of its own process group).
type process struct {
	id  string
	pid int

	status chan unix.WaitStatus // from the reaper, exactly once
	exited atomic.Bool          // leader reaped

	stdinMu      sync.Mutex
	stdinQueue   chan []byte
	stdinPending int
	stdinClosed  bool
	stdin        *os.File

	stdout, stderr *os.File
	// egress is the spawn's proxy (nil without Options.Egress); closed
	// once the process has exited.
	egress *proxy.Namespaced
	// cgroup is the spawn's cgroup (nil without spawn cgroups), read for
	// the exit's oomKillCount and released after it; endpoint its
	// guest-request socket (nil if none), closed at the exit.
	cgroup   *spawnCgroup
	endpoint *endpoint

	// credit holds the output back to what the helper can take (credit.go).
	credit *outputCredit

	abandonOutput atomic.Bool  // stop forwarding output (drain timeout)
	lastOutput    atomic.Int64 // unix nanoseconds of the last output read or sent
	sendingOutput atomic.Int32 // pumps blocked sending an event
}

// processTable holds the running processes by spawn id and by pid.
type processTable struct {
	a *agent

	mu       sync.Mutex
	byID     map[string]*process
	byPID    map[int]*process
	closing  bool           // shutdown started: no new spawns
	finished chan struct{}  // signalled when a process leaves the table
	wg       sync.WaitGroup // per-process goroutines

	uids sessionUIDs   // isolated spawns' uids by session
	seq  atomic.Uint64 // names the guest-request sockets of spawns not isolated
	// filter is the spawns' seccomp program (confine.go); nil when this
	// architecture has none, and then no spawn starts.
	filter []bpf.RawInstruction
}

func newProcessTable(a *agent) *processTable {
	filter, err := seccomp.Program()
	if err != nil {
		a.log.Error("spawned processes cannot be confined: none will start", "err", err)
	}
	return &processTable{
		a:        a,
		byID:     make(map[string]*process),
		byPID:    make(map[int]*process),
		finished: make(chan struct{}, 1),
		filter:   filter,
	}
}

// startReaper starts the SIGCHLD-driven reaper; the returned func stops it.
func (t *processTable) startReaper() (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			t.reapAll()
			select {
			case <-sigs:
			case <-quit:
				t.reapAll()
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(quit)
		<-done
	}
}

// reapAll reaps every child that has ended. Statuses of our processes go to
// them; others are orphans and are only logged.
func (t *processTable) reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return // ECHILD (no children) or nothing ended yet
		}
		t.mu.Lock()
		p := t.byPID[pid]
		if p != nil {
			delete(t.byPID, pid)
		}
		t.mu.Unlock()
		if p == nil {
			t.a.log.Debug("reaped an orphan", "pid", pid, "status", int(ws))
			continue
		}
		p.exited.Store(true)
		p.status <- ws
	}
}

// run forwards a process's output, stdin, and finally its exit.
func (t *processTable) run(p *process) {
	defer t.wg.Done()
	var streams sync.WaitGroup
	streams.Add(2)
	go func() { defer streams.Done(); t.pump(p, p.stdout, protocol.EventStdout) }()
	go func() { defer streams.Done(); t.pump(p, p.stderr, protocol.EventStderr) }()
	stdinDone := make(chan struct{})
	go func() { defer close(stdinDone); t.stdinWriter(p) }()

	ws := <-p.status
	p.closeStdin()
	<-stdinDone

	drained := make(chan struct{})
	go func() { streams.Wait(); close(drained) }()
	t.waitDrained(p, drained)
	closeAll(p.stdout, p.stderr)
	if p.egress != nil {
		// Background children of the process lose their way out with it.
		p.egress.Close()
	}
	if p.endpoint != nil {
		p.endpoint.close()
	}
	ev := exitEvent(p.id, ws)
	if p.cgroup != nil {
		if n, ok := p.cgroup.oomKills(); ok {
			ev.OOMKillCount = &n
		}
		t.a.cgroups.release(p.cgroup)
	}
	t.mu.Lock()
	delete(t.byID, p.id)
	if len(t.byID) == 0 {
		t.a.idle.idle()
	}
	t.mu.Unlock()
	if ev.ExitCode != nil {
		t.a.log.Info("process exited", "id", p.id, "pid", p.pid, "exitCode", *ev.ExitCode)
	} else {
		t.a.log.Info("process killed", "id", p.id, "pid", p.pid, "signal", ev.Signal)
	}
	t.a.emit(ev)
	select {
	case t.finished <- struct{}{}:
	default:
	}
}

// exitEvent reports a process's end: its exit code, or the signal that
// ended it.
func exitEvent(id string, ws unix.WaitStatus) protocol.Event {
	ev := protocol.Event{Type: protocol.EventExit, ID: id}
	switch {
	case ws.Signaled():
		ev.Signal = protocol.SignalName(ws.Signal())
	case ws.Exited():
		code := ws.ExitStatus()
		ev.ExitCode = &code
	default:
		code := -1
		ev.ExitCode = &code
	}
	return ev
}

// waitDrained waits until both output pipes reach EOF. If they stay open
// after the process has exited (a background child holds them) and no output
// has flowed for OutputDrain, forwarding stops so the exit can be reported.
// Output that is still flowing is not cut, unless it goes on for
// maxDrainAfterExit (a background child that keeps writing); time spent
// waiting for the helper's credit does not count (the client reads slowly,
// the output is not lost for that).
func (t *processTable) waitDrained(p *process, drained <-chan struct{}) {
	exited := time.Now()
	waitedBefore := p.credit.waitedFor()
	p.lastOutput.Store(exited.UnixNano())
	for {
		wait := t.a.opts.OutputDrain - time.Since(time.Unix(0, p.lastOutput.Load()))
		if p.sendingOutput.Load() > 0 {
			wait = t.a.opts.OutputDrain
		}
		flowing := time.Since(exited) - (p.credit.waitedFor() - waitedBefore)
		if wait <= 0 || flowing > maxDrainAfterExit {
			break
		}
		timer := time.NewTimer(wait)
		select {
		case <-drained:
			timer.Stop()
			return
		case <-timer.C:
		}
	}
	t.a.log.Info("process exited but its output is still held open; closing it", "id", p.id)
	p.abandonOutput.Store(true)
	_ = p.stdout.SetReadDeadline(time.Now())
	_ = p.stderr.SetReadDeadline(time.Now())
	<-drained
}

// pump streams one output pipe as UTF-8 chunks: read, briefly coalesce, send.
func (t *processTable) pump(p *process, f *os.File, eventType string) {
	var chunker utf8Chunker
	buf := make([]byte, maxChunkBytes)
	send := func(text string) {
		if text != "" {
			p.sendingOutput.Add(1)
			p.credit.take(protocol.OutputCost(len(text)))
			t.a.emit(protocol.Event{Type: eventType, ID: p.id, Data: text})
			p.lastOutput.Store(time.Now().UnixNano())
			p.sendingOutput.Add(-1)
		}
	}
	for {
		// Block for the first bytes of a chunk.
		n, err := f.Read(buf[:readBufferSize])
		if err == nil && n < coalesceEnough {
			// Small output: coalesce what follows quickly.
			_ = f.SetReadDeadline(time.Now().Add(coalesceWindow))
			for n < coalesceEnough {
				m, rerr := f.Read(buf[n:min(n+readBufferSize, maxChunkBytes)])
				n += m
				if rerr != nil {
					if !errors.Is(rerr, os.ErrDeadlineExceeded) {
						err = rerr
					}
					break
				}
			}
			_ = f.SetReadDeadline(time.Time{})
		}
		if n > 0 {
			p.lastOutput.Store(time.Now().UnixNano())
		}
		send(chunker.Push(buf[:n]))
		// abandonOutput is stored before the abandoning deadline is set, so
		// checking it after clearing our own deadline cannot miss it.
		if err != nil || p.abandonOutput.Load() {
			send(chunker.Flush())
			return
		}
	}
}

// stdinWriter writes queued stdin data until the process exits.
func (t *processTable) stdinWriter(p *process) {
	defer p.stdin.Close()
	for data := range p.stdinQueue {
		_, err := p.stdin.Write(data)
		p.stdinMu.Lock()
		p.stdinPending -= len(data)
		p.stdinMu.Unlock()
		if err != nil {
			t.a.log.Debug("stdin write failed", "id", p.id, "err", err)
			// Keep draining the queue so pending counts stay right.
		}
	}
}

// closeStdin stops accepting stdin and unblocks a pending write.
func (p *process) closeStdin() {
	p.endInput()
	// A write blocked on a full pipe returns once the deadline passes.
	_ = p.stdin.SetWriteDeadline(time.Now())
}

// endInput closes the stdin queue once, whichever of end of input
// (endStdin) and the process's end comes first: stdinWriter writes what
// is queued, then closes the pipe.
func (p *process) endInput() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if !p.stdinClosed {
		p.stdinClosed = true
		close(p.stdinQueue)
	}
}

// stdin queues data for a process's stdin without blocking the caller.
func (t *processTable) stdin(id string, data []byte) error {
	p, err := t.lookup(id)
	if err != nil {
		return err
	}
	if len(data) == 0 {
		return nil
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdinClosed || p.exited.Load() {
		return fmt.Errorf("process %s: its stdin is closed (it has exited, or its input has ended)", id)
	}
	if p.stdinPending+len(data) > maxStdinPending {
		return fmt.Errorf("process %s is not reading its stdin (%d bytes already waiting)", id, p.stdinPending)
	}
	select {
	case p.stdinQueue <- data:
		p.stdinPending += len(data)
		return nil
	default:
		return fmt.Errorf("process %s is not reading its stdin (%d writes already waiting)", id, cap(p.stdinQueue))
	}
}

// kill signals a process's group.
func (t *processTable) kill(id, signalName string) error {
	sig, err := protocol.ParseSignal(signalName)
	if err != nil {
		return err
	}
	p, err := t.lookup(id)
	if err != nil {
		return err
	}
	if err := unix.Kill(-p.pid, sig); err != nil {
		if errors.Is(err, unix.ESRCH) && p.exited.Load() {
			return nil // exited; the exit event is on its way
		}
		return fmt.Errorf("signalling process %s: %w", id, err)
	}
	return nil
}

func (t *processTable) lookup(id string) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.byID[id]
	if p == nil {
		return nil, fmt.Errorf("no running process with id %q", id)
	}
	return p, nil
}

// signalAll signals every process group; as PID 1 also every other process.
func (t *processTable) signalAll(sig syscall.Signal) int {
	t.mu.Lock()
	pids := make([]int, 0, len(t.byID))
	for _, p := range t.byID {
		pids = append(pids, p.pid)
	}
	t.mu.Unlock()
	for _, pid := range pids {
		_ = unix.Kill(-pid, sig)
	}
	if os.Getpid() == 1 && sig == unix.SIGKILL {
		// Only PID 1 of its own namespace or VM may do this: it reaches
		// every process but itself (daemons that left our groups).
		_ = unix.Kill(-1, sig)
	}
	return len(pids)
}

// terminateAll refuses new spawns, sends SIGTERM, waits up to grace, sends
// SIGKILL, and waits until every exit event has been sent.
func (t *processTable) terminateAll(grace time.Duration) {
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
	t.unlimitAll()
	if t.signalAll(unix.SIGTERM) > 0 {
		deadline := time.NewTimer(grace)
		defer deadline.Stop()
	wait:
		for t.running() > 0 {
			select {
			case <-t.finished:
			case <-deadline.C:
				break wait
			}
		}
	}
	if t.running() > 0 {
		t.a.log.Info("processes still running after the grace period; sending SIGKILL", "count", t.running())
	}
	t.signalAll(unix.SIGKILL)
	// A process stuck in the kernel (uninterruptible sleep) must not keep the
	// guest from ending; its exit is then never reported.
	all := make(chan struct{})
	go func() { t.wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(killWait):
		t.a.log.Error("processes did not die after SIGKILL; giving up on them", "count", t.running())
	}
}

func (t *processTable) running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// lookPath resolves command the way a shell would with env's PATH.
func lookPath(command string, env []string, cwd string) (string, error) {
	if strings.Contains(command, "/") {
		path := command
		if !filepath.IsAbs(path) {
			path = filepath.Join(cwd, path)
		}
		if err := checkExecutable(path); err != nil {
			return "", err
		}
		return path, nil
	}
	pathVar := protocol.DefaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		path := filepath.Join(dir, command)
		if checkExecutable(path) == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("command %q not found in PATH %q", command, pathVar)
}

func checkExecutable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("command %s: %w", path, err)
	}
	if st.IsDir() {
		return fmt.Errorf("command %s is a directory", path)
	}
	if err := unix.Access(path, unix.X_OK); err != nil {
		return fmt.Errorf("command %s is not executable: %w", path, err)
	}
	return nil
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}
