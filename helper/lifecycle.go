package helper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc"
)

// Startup step names reported as startupStep events.
const (
	StepLaunchGuest  = "launch_guest"
	StepConnectAgent = "connect_agent"
	// Inside connect_agent: the agent's hello read, its root set up (the
	// system directories shared and mounted), the SDK mounted.
	StepAgentHello = "agent_hello"
	StepGuestSetup = "guest_setup"
	StepSDKMount   = "sdk_mount"
)

const (
	// agentCallTimeout bounds one ordinary agent request.
	agentCallTimeout = 20 * time.Second
	// pingFailuresFatal consecutive failed pings (each unanswered within
	// pingTimeoutIntervals ping intervals) declare the guest dead. Fewer
	// change nothing: isGuestConnected stays true through a slow ping (a
	// guest busy compiling, a host under load), since the client takes a
	// false answer for a dead guest.
	pingFailuresFatal    = 3
	pingTimeoutIntervals = 5
	// shutdownSendTimeout bounds the write of stopVM's shutdown request: a
	// guest that does not read it by then (its agent hung, or hostile) is
	// stopped forcibly at once. shutdownExitMargin is how long, past the
	// grace period, the agent has to answer it and exit.
	shutdownSendTimeout = 2 * time.Second
	shutdownExitMargin  = 5 * time.Second
	// maxEventData caps one stdout/stderr event's data; longer chunks from
	// the agent are split so no event frame nears the 10 MiB limit.
	maxEventData = 1 << 20
	// maxErrorMessage caps an error event's message from the agent.
	maxErrorMessage = 4096
)

// guestInstance is one guest from startVM until it has ended and been cleaned
// up. Its run goroutine owns the teardown.
type guestInstance struct {
	s       *Service
	backend Backend
	ctx     context.Context
	cancel  context.CancelFunc

	// config is what the guest is started with (again, for a cold boot
	// after a failed warm start: retryCold).
	config GuestConfig

	connected atomic.Bool
	// reclaimed: the host was short and the guest was asked for memory
	// (memwatch.go).
	reclaimed atomic.Bool
	// sessionTmp: the sessions' /tmp is on the guest's root disk, which
	// pruneSessionCaches and deleteSessionDirs clean through the agent.
	sessionTmp atomic.Bool
	stopping   atomic.Bool   // stopVM asked for the end
	ending     atomic.Bool   // the teardown has begun (stop or death)
	ended      chan struct{} // closed when fully torn down

	mu    sync.Mutex
	guest Guest
	agent *agentrpc.Client

	// mounts owns what the helper has mounted in this guest
	// (sessionmounts.go).
	mounts sessionMounts
	// uids are the uids of the guest's sessions (sessionuid.go).
	uids sessionUIDs

	credits creditSender // output credit to the agent (flow.go)
}

func (s *Service) startVM(ctx context.Context, p protocol.StartVMParams) (empty, error) {
	s.mu.Lock()
	for s.guest != nil {
		old := s.guest
		if !old.stopping.Load() && !old.ending.Load() {
			s.mu.Unlock()
			return nil, nil // already starting or running: nothing to do
		}
		// A guest on its way out: wait for it, then start a new one.
		s.mu.Unlock()
		select {
		case <-old.ended:
		case <-ctx.Done():
			return nil, fmt.Errorf("startVM: the previous guest is still stopping: %w", ctx.Err())
		}
		s.mu.Lock()
	}
	factory := s.opts.Backends[s.opts.Backend]
	if factory == nil {
		s.mu.Unlock()
		return nil, s.missingBackendError()
	}
	mem := s.memoryMB
	if p.MemoryGB != nil && *p.MemoryGB > 0 && *p.MemoryGB < 1<<20 {
		mem = int(*p.MemoryGB * 1024)
	}
	cpus := s.cpuCount
	if p.CPUCount != nil && *p.CPUCount > 0 && *p.CPUCount < 1<<16 {
		cpus = int(*p.CPUCount)
	}
	noteBundle := p.BundlePath != "" && p.BundlePath != s.bundleNoted
	s.bundleNoted = p.BundlePath
	vmCtx, cancel := context.WithCancel(context.Background())
	inst := &guestInstance{s: s, ctx: vmCtx, cancel: cancel, ended: make(chan struct{})}
	inst.mounts.guest = inst
	s.guest = inst
	s.mu.Unlock()

	fail := func(err error) (empty, error) {
		cancel()
		s.mu.Lock()
		if s.guest == inst {
			s.guest = nil
		}
		s.mu.Unlock()
		close(inst.ended)
		s.log.Error("startVM failed", "err", err)
		return nil, err
	}

	backend, err := factory()
	if err != nil {
		return fail(fmt.Errorf("the %s backend is unavailable: %w%s", s.opts.Backend, err, s.fallbackHint(err)))
	}
	if bb, ok := backend.(BundleBooter); noteBundle && (!ok || !bb.BootsBundles()) {
		s.log.Info("the client's VM bundle is not booted: the guest is cowork-vmm's own (its kernel over the host's "+
			"system directories, with the profile's root disk for changes); booting a bundle's rootfs image is not supported",
			"bundlePath", p.BundlePath, "rootfs", bundleRootfs(p.BundlePath))
	}
	inst.backend = backend
	inst.config = GuestConfig{MemoryMiB: mem, CPUCount: cpus, StepFunc: s.step, RootDisk: s.rootDiskFor(backend),
		Bundle: p.BundlePath, ProfileDir: s.profileDir()}
	s.log.Info("starting guest", "backend", backend.Name(), "memoryMB", mem, "cpus", cpus)
	if err := inst.launch(); err != nil {
		return fail(err)
	}
	go inst.run()
	s.monitorNetwork(vmCtx, p.APIProbeURL)
	return nil, nil
}

func (s *Service) missingBackendError() error {
	var names []string
	for _, n := range slices.Sorted(maps.Keys(s.opts.Backends)) {
		if s.opts.Backends[n] != nil {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		names = []string{"none in this build"}
	}
	return fmt.Errorf("the %s backend is not in this build (COWORK_VMM_BACKEND; available backends: %s)%s",
		s.opts.Backend, strings.Join(names, ", "), s.opts.FallbackHint)
}

// fallbackHint is Options.FallbackHint, unless the backend's own error
// already names a backend to choose (the user reads it once).
func (s *Service) fallbackHint(err error) string {
	if strings.Contains(err.Error(), "COWORK_VMM_BACKEND=") {
		return ""
	}
	return s.opts.FallbackHint
}

func (s *Service) step(step, status string) {
	s.hub.Publish(protocol.Event{Type: protocol.EventStartupStep, Step: step, Status: status})
}

// launch starts a guest of inst.config on the instance's backend, serves
// its egress and makes it the instance's guest.
func (inst *guestInstance) launch() error {
	s, backend := inst.s, inst.backend
	s.step(StepLaunchGuest, protocol.StepStarted)
	guest, err := backend.Start(inst.ctx, inst.config)
	if err != nil {
		s.step(StepLaunchGuest, protocol.StepFailed)
		return fmt.Errorf("starting the guest (%s backend): %w%s", backend.Name(), err, s.fallbackHint(err))
	}
	if err := s.serveEgress(inst.ctx, guest); err != nil {
		_ = guest.Stop(context.Background())
		s.step(StepLaunchGuest, protocol.StepFailed)
		return fmt.Errorf("starting the guest (%s backend): %w", backend.Name(), err)
	}
	s.step(StepLaunchGuest, protocol.StepCompleted)
	inst.mu.Lock()
	inst.guest = guest
	inst.mu.Unlock()
	return nil
}

// run connects to the agent, sets the guest up, watches it, and tears it
// down when it is stopped or dies.
func (inst *guestInstance) run() {
	s := inst.s
	defer close(inst.ended)
	err := inst.connectWhileAlive()
	if err != nil {
		err = inst.retryCold(err)
	}
	if err == nil {
		s.log.Info("guest agent connected", "kernel", inst.agent.Hello().Kernel)
		go inst.pingLoop()
		select {
		case <-inst.ctx.Done():
		case <-inst.guest.Done():
			err = inst.guest.Err()
			if err == nil {
				err = errors.New("the guest exited")
			}
		case <-inst.agent.Done():
			err = inst.agent.Err()
			// A dying guest usually drops the connection first; its own
			// reason (e.g. "killed") says more, if it comes soon.
			select {
			case <-inst.guest.Done():
				if gerr := inst.guest.Err(); gerr != nil {
					err = gerr
				}
			case <-time.After(time.Second):
			}
		}
	}
	inst.ending.Store(true)
	inst.connected.Store(false)
	if n := guestRequests.dropGuest(inst); n > 0 {
		s.log.Info("the guest's waiting guest requests are dropped", "requests", n)
	}
	if inst.stopping.Load() {
		inst.shutdown()
		s.log.Info("guest stopped")
	} else {
		s.log.Error("guest ended unexpectedly", "err", err)
		s.hub.Publish(protocol.Event{Type: protocol.EventError, Message: fmt.Sprintf("the guest ended unexpectedly: %v", err), Fatal: ptr(true)})
		inst.forceStop()
	}
	s.reapProcesses(inst, fmt.Sprintf("the guest ended: %v", err))
	inst.cancel()
	s.mu.Lock()
	if s.guest == inst {
		s.guest = nil
	}
	s.mu.Unlock()
}

// connectWhileAlive runs connect, cut short when the guest ends first: a
// VM that died (a kernel panic) may leave its agent connection open until
// it is stopped, and a call waiting on that connection would wait out its
// whole timeout. The guest's own reason wins over the call's error.
func (inst *guestInstance) connectWhileAlive() error {
	guest, _ := inst.current()
	ctx, cancel := context.WithCancel(inst.ctx)
	defer cancel()
	connected, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-guest.Done():
			cancel()          // fails a wait for the agent or its hello at once,
			inst.closeAgent() // and a call to it
		case <-connected:
		}
	}()
	err := inst.connect(ctx)
	close(connected)
	<-watched // it closes no agent of a later attempt (retryCold)
	if err == nil {
		return nil
	}
	select {
	case <-guest.Done():
		if gerr := guest.Err(); gerr != nil {
			return gerr
		}
		return fmt.Errorf("the guest exited while its agent connected: %w", err)
	default:
		return err
	}
}

// current returns the instance's guest and its agent's connection (nil
// until launched, and until the agent said hello).
func (inst *guestInstance) current() (Guest, *agentrpc.Client) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return inst.guest, inst.agent
}

// closeAgent closes the connection to the agent, if it has one: its
// pending calls fail.
func (inst *guestInstance) closeAgent() {
	if _, agent := inst.current(); agent != nil {
		agent.Close()
	}
}

// retryCold boots the guest again, cold, when the one started failed to
// connect (cause) because it was restored from a snapshot (Restorable)
// and ended; the snapshot is discarded first. Any other failure, or a
// stop, returns cause: a cold boot would not mend it.
func (inst *guestInstance) retryCold(cause error) error {
	guest, _ := inst.current()
	warm, ok := guest.(Restorable)
	if !ok || !warm.Restored() || inst.stopping.Load() || inst.ctx.Err() != nil {
		return cause
	}
	select {
	case <-guest.Done():
	default:
		if !resumed(guest) { // a resumed guest is retried however it failed
			return cause
		}
	}
	inst.s.log.Warn("the guest restored from the snapshot or resumed failed before its agent was set up; discarding the snapshot and booting cold", "err", cause)
	warm.DiscardSnapshot()
	inst.forceStop()
	inst.mu.Lock()
	inst.agent = nil
	inst.mu.Unlock()
	if err := inst.launch(); err != nil {
		return fmt.Errorf("%w (booting cold after the guest restored from the snapshot ended: %v)", err, cause)
	}
	return inst.connectWhileAlive()
}

// connect waits for the agent, reads its hello and sends setup.
func (inst *guestInstance) connect(ctx context.Context) error {
	s := inst.s
	s.step(StepConnectAgent, protocol.StepStarted)
	defer s.step(StepConnectAgent, protocol.StepCompleted)
	conn, err := inst.guest.Agent(ctx)
	if err != nil {
		return fmt.Errorf("waiting for the guest agent: %w", err)
	}
	s.step(StepAgentHello, protocol.StepStarted)
	agent, err := agentrpc.Dial(ctx, conn, s.log, func(ev protocol.Event) { s.onAgentEvent(inst, ev) })
	if err != nil {
		return err
	}
	s.step(StepAgentHello, protocol.StepCompleted)
	inst.mu.Lock()
	inst.agent = agent
	inst.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err // the guest ended as the agent said hello (connectWhileAlive)
	}

	s.step(StepGuestSetup, protocol.StepStarted)
	setUp := inst.setUpRoot
	if resumed(inst.guest) {
		setUp = inst.resumeRoot
	}
	if err := setUp(); err != nil {
		return err
	}
	s.step(StepGuestSetup, protocol.StepCompleted)
	s.mu.Lock()
	sdk := s.sdk
	s.mu.Unlock()
	if sdk != nil {
		s.step(StepSDKMount, protocol.StepStarted)
		if err := inst.mountSDK(sdk); err != nil {
			if _, statErr := os.Stat(sdk.file); statErr == nil {
				return err
			}
			// Gone from the host since installSdk (the client replaced
			// its version): boot without it until installSdk again.
			s.log.Warn("the installed SDK is gone from the host; the guest starts without it", "path", sdk.file, "err", err)
			s.forgetSDK(sdk)
		}
		s.step(StepSDKMount, protocol.StepCompleted)
	}
	inst.connected.Store(true)
	return nil
}

// setUpRoot shares the system directories and has the agent mount them;
// it logs how long each of the agent's steps took.
func (inst *guestInstance) setUpRoot() error {
	s := inst.s
	began := time.Now()
	setup := protocol.SetupParams{NewRoot: true, Hostname: "cowork"}
	shareSystem := func(dir string) (protocol.MountSource, error) { return inst.guest.Share(dir, true) }
	if ss, ok := inst.guest.(SystemSharer); ok {
		shareSystem = ss.ShareSystem
	}
	systemDirs := s.opts.SystemDirs
	if iu, ok := inst.guest.(ImageUserland); ok && iu.BootsImage() {
		systemDirs = nil // the image is the userland: nothing of the host's
	}
	for _, dir := range systemDirs {
		if link, ok := systemLink(dir, systemDirs); ok {
			setup.System = append(setup.System, protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindSymlink, Path: link}, Target: dir, ReadOnly: true})
			continue
		}
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		src, err := shareSystem(dir)
		if err != nil {
			return fmt.Errorf("sharing %s with the guest: %w", dir, err)
		}
		setup.System = append(setup.System, protocol.Mount{Source: src, Target: dir, ReadOnly: true})
	}
	if a, ok := inst.guest.(SetupAdjuster); ok {
		a.AdjustSetup(&setup)
	}
	if setup.RootDisk != nil && len(systemDirs) > 0 {
		setup.RootDisk.PackageDB = sharePackageDB(shareSystem, s.log)
	}
	shared := time.Now()
	var result protocol.SetupResult
	if err := inst.call(protocol.AgentMethodSetup, setup, &result); err != nil {
		return fmt.Errorf("setting up the guest's root filesystem: %w", err)
	}
	attrs := []any{"share", shared.Sub(began).Round(time.Microsecond), "setup", time.Since(shared).Round(time.Microsecond)}
	for _, step := range result.Steps {
		attrs = append(attrs, "agent."+step.Name, time.Duration(step.Micros)*time.Microsecond)
	}
	if result.RootDisk != "" {
		attrs = append(attrs, "rootDisk", result.RootDisk, "sessionTmpOnDisk", result.SessionTmp)
	}
	inst.sessionTmp.Store(result.SessionTmp)
	s.log.Info("guest root set up", attrs...)
	return nil
}

// bundleRootfs describes the rootfs image of the client's bundle at dir,
// for the log line that says it is not booted.
func bundleRootfs(dir string) string {
	st, err := os.Stat(filepath.Join(dir, "rootfs.img"))
	if err != nil {
		return "no rootfs.img"
	}
	return fmt.Sprintf("rootfs.img, %d bytes, not read", st.Size())
}

// HostPackageDB is the host's dpkg database, which a guest with a root
// disk gets (read-only, as the lower layer of its own) so that dpkg in the
// guest knows what the shared /usr holds.
const HostPackageDB = "/var/lib/dpkg"

// sharePackageDB shares HostPackageDB when the host has one (nil: none,
// or it could not be shared, which only costs the guest's dpkg its view).
func sharePackageDB(share func(string) (protocol.MountSource, error), log *slog.Logger) *protocol.MountSource {
	if st, err := os.Stat(HostPackageDB); err != nil || !st.IsDir() {
		return nil
	}
	src, err := share(HostPackageDB)
	if err != nil {
		log.Warn("the guest's dpkg gets no view of the host's packages", "path", HostPackageDB, "err", err)
		return nil
	}
	return &src
}

// systemLink returns the target of dir when dir is a symlink into another
// of the system directories dirs, itself a real directory (merged /usr:
// /bin -> usr/bin): the guest gets the same symlink, which costs nothing,
// rather than the directory shared and mounted a second time.
func systemLink(dir string, dirs []string) (string, bool) {
	fi, err := os.Lstat(dir)
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return "", false
	}
	link, err := os.Readlink(dir)
	if err != nil {
		return "", false
	}
	resolved := link
	if !filepath.IsAbs(link) {
		resolved = filepath.Join(filepath.Dir(dir), link)
	}
	resolved = filepath.Clean(resolved)
	for _, other := range dirs {
		if other == dir || (resolved != other && !strings.HasPrefix(resolved, other+"/")) {
			continue
		}
		if st, err := os.Lstat(other); err == nil && st.IsDir() {
			return link, true
		}
	}
	return "", false
}

// call sends one request to the agent with the ordinary timeout.
func (inst *guestInstance) call(method string, params, result any) error {
	_, agent := inst.current()
	if agent == nil {
		return errors.New("the guest agent is not connected")
	}
	ctx, cancel := context.WithTimeout(inst.ctx, agentCallTimeout)
	defer cancel()
	return agent.Call(ctx, method, params, result)
}

// pingLoop pings the agent every PingInterval and declares the guest dead
// (closing the agent channel, which run sees) after pingFailuresFatal
// pings in a row went unanswered. A ping that fails alone is logged and
// forgotten at the next answer; so is one a busy guest left unanswered
// (busyNotDead), up to pingBusyFatal in a row.
func (inst *guestInstance) pingLoop() {
	interval := inst.s.opts.PingInterval
	t := time.NewTicker(interval)
	defer t.Stop()
	failures, busy := 0, 0
	for {
		select {
		case <-inst.ctx.Done():
			return
		case <-inst.agent.Done():
			return
		case <-t.C:
		}
		pingStart, progress := time.Now(), inst.progress()
		ctx, cancel := context.WithTimeout(inst.ctx, pingTimeoutIntervals*interval)
		err := inst.agent.Call(ctx, protocol.AgentMethodPing, nil, nil)
		cancel()
		if inst.ctx.Err() != nil {
			return
		}
		if err == nil {
			if failures > 0 {
				inst.s.log.Info("guest agent answers pings again", "failed", failures)
			}
			failures, busy = 0, 0
			continue
		}
		if busy < pingBusyFatal && inst.busyNotDead(pingStart, progress) {
			busy++
			inst.s.log.Info("guest agent did not answer a ping, but it is busy, not dead: it still talks and runs",
				"err", err, "busy", busy, "fatal", pingBusyFatal)
			continue
		}
		failures++
		inst.s.log.Warn("guest agent did not answer a ping", "err", err, "failures", failures, "fatal", pingFailuresFatal)
		if failures >= pingFailuresFatal {
			inst.connected.Store(false)
			inst.agent.Close() // run sees agent.Done and tears the guest down
			return
		}
	}
}

// stop asks the run goroutine to shut the guest down and waits for it.
func (inst *guestInstance) stop(ctx context.Context) error {
	inst.stopping.Store(true)
	inst.cancel()
	select {
	case <-inst.ended:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stopping the guest: %w", ctx.Err())
	}
}

// shutdown ends the guest cleanly if it cooperates: it is suspended when
// it can be (trySuspend), else the agent ends every process (SIGTERM,
// then SIGKILL after the grace period) and exits. Then,
// whatever the guest did, the backend frees it (forceStop): a guest that
// does not read the shutdown request within shutdownSendTimeout, or does
// not exit within the grace period and shutdownExitMargin, is not waited
// for any longer.
func (inst *guestInstance) shutdown() {
	guest, agent := inst.current()
	if agent != nil && agent.Err() == nil && !inst.trySuspend(guest, agent) {
		if err := inst.askShutdown(guest, agent); err != nil {
			inst.s.log.Warn("the guest did not shut down cleanly; stopping it forcibly", "err", err)
		}
	}
	inst.forceStop()
}

// askShutdown sends the agent's shutdown request and waits for the agent
// to exit.
func (inst *guestInstance) askShutdown(guest Guest, agent *agentrpc.Client) error {
	grace := inst.s.opts.StopGrace
	ctx, cancel := context.WithTimeout(context.Background(), grace+shutdownExitMargin)
	defer cancel()
	if err := askFinal(ctx, agent, protocol.AgentMethodShutdown, protocol.ShutdownParams{GraceMillis: int(grace / time.Millisecond)}); err != nil {
		return err
	}
	// The agent exits once its processes are gone; their exit events
	// arrive before the connection closes.
	select {
	case <-agent.Done():
	case <-guest.Done():
	case <-ctx.Done():
		return errors.New("the guest agent did not exit after its shutdown")
	}
	return nil
}

// askFinal sends the agent a final request (shutdown, suspend) and waits
// for its answer until ctx ends; the request's write is bounded by
// shutdownSendTimeout: a guest that does not read it (its agent hung, or
// hostile) is given up on at once.
func askFinal(ctx context.Context, agent *agentrpc.Client, method string, params any) error {
	sendCtx, cancelSend := context.WithTimeout(context.Background(), shutdownSendTimeout)
	call, err := agent.Begin(sendCtx, method, params)
	cancelSend()
	if err != nil {
		return err
	}
	return call.Wait(ctx, nil)
}

// forceStop frees the guest and waits for the agent's read loop, so every
// event the agent sent has been published before exits are synthesised.
func (inst *guestInstance) forceStop() {
	guest, agent := inst.current()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if guest != nil {
		if err := guest.Stop(ctx); err != nil {
			inst.s.log.Warn("stopping the guest", "err", err)
		}
	}
	if agent != nil {
		agent.Close()
		select {
		case <-agent.Done():
		case <-ctx.Done():
		}
	}
}

// reapProcesses reports an exit for every process of inst still running.
func (s *Service) reapProcesses(inst *guestInstance, reason string) {
	s.mu.Lock()
	procs := s.procs.runningIn(inst)
	sort.Slice(procs, func(i, j int) bool { return procs[i].id < procs[j].id })
	var events []protocol.Event
	for _, p := range procs {
		if s.procs.markExited(p, nil, "SIGKILL") {
			s.egressReg.Unregister(p.id)
			s.sizes.stale(p.session)
			events = append(events, exitEvent(p))
		}
	}
	s.mu.Unlock()
	for _, ev := range events {
		if !inst.stopping.Load() {
			s.hub.Publish(protocol.Event{Type: protocol.EventError, ID: ev.ID, Message: reason, Fatal: ptr(true)})
		}
		s.hub.Publish(ev)
	}
}

func (s *Service) stopVMCall(ctx context.Context, _ struct{}) (empty, error) {
	return nil, s.stopVM(ctx)
}

func (s *Service) stopVM(ctx context.Context) error {
	s.mu.Lock()
	inst := s.guest
	s.mu.Unlock()
	if inst == nil {
		return nil
	}
	s.log.Info("stopping guest")
	return inst.stop(ctx)
}

// onAgentEvent validates one event from the agent (the guest is not
// trusted) and publishes it.
func (s *Service) onAgentEvent(inst *guestInstance, ev protocol.Event) {
	switch ev.Type {
	case protocol.EventStdout, protocol.EventStderr, protocol.EventExit, protocol.EventError:
	case protocol.EventRequest:
		s.onGuestRequest(inst, ev)
		return
	default:
		s.log.Debug("agent event of unexpected type dropped", "type", ev.Type)
		return
	}
	s.mu.Lock()
	p := s.procs.get(ev.ID)
	if p == nil || p.guest != inst {
		s.mu.Unlock()
		s.log.Debug("agent event for an unknown process dropped", "type", ev.Type, "id", ev.ID)
		return
	}
	switch ev.Type {
	case protocol.EventExit:
		var code *int
		signal := ""
		if ev.Signal != "" {
			// The agent reports protocol.SignalName; from a hostile
			// guest, anything else is reported as SIGKILL.
			var err error
			if signal, err = protocol.CanonicalSignal(ev.Signal); err != nil {
				signal = "SIGKILL"
			}
		} else {
			c := 0
			if ev.ExitCode != nil && *ev.ExitCode >= 0 && *ev.ExitCode <= 255 {
				c = *ev.ExitCode
			}
			code = &c
		}
		if !s.procs.markExited(p, code, signal) {
			s.mu.Unlock()
			return
		}
		s.egressReg.Unregister(p.id)
		s.sizes.stale(p.session) // what it wrote is in the session now
		out := exitEvent(p)
		out.OOMKillCount = oomKillCount(ev.OOMKillCount)
		s.mu.Unlock()
		if p.signal != "" {
			s.log.Info("process exited", "id", p.id, "session", p.session, "signal", p.signal)
		} else {
			s.log.Info("process exited", "id", p.id, "session", p.session, "exitCode", *p.exitCode)
		}
		inst.mounts.exited(p) // its session's mounts go when it was the last
		s.hub.Publish(out)
	case protocol.EventError:
		s.mu.Unlock()
		msg := ev.Message
		if len(msg) > maxErrorMessage {
			msg = splitUTF8(msg, maxErrorMessage)[0] + "…"
		}
		out := protocol.Event{Type: protocol.EventError, ID: ev.ID, Message: msg}
		if ev.Fatal != nil {
			out.Fatal = ptr(*ev.Fatal)
		}
		s.hub.Publish(out)
	default: // stdout, stderr
		s.publishOutput(p, ev)
	}
}

// publishOutput publishes an output event of p within its credit (flow.go);
// one past it is dropped. Called with s.mu held; returns with it released.
func (s *Service) publishOutput(p *process, ev protocol.Event) {
	cost := protocol.OutputCost(len(ev.Data))
	// A guest being stopped lifts its processes' windows so their last
	// output and exits go out: that output is taken (the hub's hard bound
	// still applies).
	if !p.takeOutputCredit(cost, p.guest.stopping.Load()) {
		first := !p.outputOverrun
		p.outputOverrun = true
		s.mu.Unlock()
		if first {
			s.log.Warn("the guest sent output past its process's window; dropping it", "id", p.id, "bytes", len(ev.Data))
		}
		return
	}
	s.mu.Unlock()
	chunks := splitUTF8(ev.Data, maxEventData)
	for i, chunk := range chunks {
		credit := len(chunk)
		if i == len(chunks)-1 {
			credit += protocol.OutputEventOverhead
		}
		s.hub.PublishOutput(protocol.Event{Type: ev.Type, ID: ev.ID, Data: chunk}, credit)
	}
}

// splitUTF8 cuts s into pieces of at most n bytes without splitting a
// character (s is valid UTF-8: it came through encoding/json).
func splitUTF8(s string, n int) []string {
	if len(s) <= n {
		return []string{s}
	}
	var out []string
	for len(s) > n {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		if cut == 0 {
			cut = n
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// activeVM returns the connected guest or an error the client can act on.
func (s *Service) activeVM() (*guestInstance, error) {
	s.mu.Lock()
	inst := s.guest
	s.mu.Unlock()
	if inst == nil {
		return nil, errors.New("the guest is not running: call startVM first")
	}
	if !inst.connected.Load() {
		return nil, errors.New("the guest agent is not connected yet: wait until isGuestConnected is true")
	}
	return inst, nil
}
