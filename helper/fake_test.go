package helper

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc"
)

// fakeBackend starts fakeGuests, each with an in-memory agent that speaks
// the real agent channel over a net.Pipe.
type fakeBackend struct {
	t        *testing.T
	mu       sync.Mutex
	guests   []*fakeGuest
	startErr error
	// egress becomes the next guest's egress listener; nil gives an idle
	// one, unless noEgress.
	egress   net.Listener
	noEgress bool
	// systemSharer makes the guests implement SystemSharer, as the kvm
	// backend's do.
	systemSharer bool
	// holdSetup: the next guests' agents never answer setup.
	holdSetup bool
	// restored: the next guests say they were restored from a snapshot
	// (Restorable).
	restored bool
	// suspender makes the guests implement Suspender; resumed: the next
	// guests say they were resumed.
	suspender, resumed bool
}

// setNext sets holdSetup and restored for the guests started next.
func (b *fakeBackend) setNext(holdSetup, restored bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holdSetup, b.restored = holdSetup, restored
}

// started returns the guests started so far.
func (b *fakeBackend) started() []*fakeGuest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.guests)
}

func (b *fakeBackend) Name() string { return "fake" }

func (b *fakeBackend) Start(ctx context.Context, cfg GuestConfig) (Guest, error) {
	if b.startErr != nil {
		return nil, b.startErr
	}
	helperEnd, agentEnd := net.Pipe()
	egress := b.egress
	if egress == nil && !b.noEgress {
		egress = newIdleListener()
	}
	g := &fakeGuest{cfg: cfg, helperEnd: helperEnd, done: make(chan struct{}), egress: egress}
	g.agent = newFakeAgent(agentEnd, g)
	b.mu.Lock()
	g.agent.holdSetup, g.restored = b.holdSetup, b.restored
	b.guests = append(b.guests, g)
	b.mu.Unlock()
	go g.agent.serve()
	g.resumed = b.resumed
	if b.systemSharer {
		return systemSharingGuest{g}, nil
	}
	if b.suspender {
		return suspendingGuest{g}, nil
	}
	return g, nil
}

// suspendingGuest is a fakeGuest that can be suspended (Suspender): its
// save only counts.
type suspendingGuest struct{ *fakeGuest }

func (g suspendingGuest) PrepareSuspend() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.prepared++
	return nil
}

func (g suspendingGuest) Suspend(ctx context.Context) (SuspendedState, error) {
	g.mu.Lock()
	g.saved++
	g.mu.Unlock()
	return SuspendedState{Path: "fake.snap", Bytes: 1}, g.Stop(ctx)
}

func (g suspendingGuest) Resumed() bool { return g.resumed }

// suspendCalls returns how often PrepareSuspend and Suspend were called.
func (g *fakeGuest) suspendCalls() (prepared, saved int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.prepared, g.saved
}

// Reclaim and Release implement MemoryReclaimer, counting.
func (g *fakeGuest) Reclaim() { g.mu.Lock(); g.reclaims++; g.mu.Unlock() }
func (g *fakeGuest) Release() { g.mu.Lock(); g.releases++; g.mu.Unlock() }

// memoryCalls returns how often Reclaim and Release were called.
func (g *fakeGuest) memoryCalls() (reclaims, releases int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reclaims, g.releases
}

// systemSharingGuest is a fakeGuest that shares system directories apart
// (SystemSharer), as a 9p export in cache mode loose on its own tag.
type systemSharingGuest struct{ *fakeGuest }

const fakeSystemTag = "fake-sys"

func (g systemSharingGuest) ShareSystem(hostPath string) (protocol.MountSource, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.systemShares = append(g.systemShares, hostPath)
	return protocol.MountSource{Kind: "9p", Tag: fakeSystemTag, Aname: "sys" + strconv.Itoa(len(g.systemShares)), Cache: protocol.NinePCacheLoose}, nil
}

func (b *fakeBackend) last() *fakeGuest {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.guests) == 0 {
		return nil
	}
	return b.guests[len(b.guests)-1]
}

type fakeGuest struct {
	cfg       GuestConfig
	helperEnd net.Conn
	agent     *fakeAgent
	// egress, if set by the backend, is returned by Egress (Guest.Egress).
	egress net.Listener

	mu     sync.Mutex
	shares []protocol.MountSource
	// sharedPaths are the host paths Share got; unshares what Unshare got.
	sharedPaths []string
	unshares    []protocol.MountSource
	// systemShares are the host paths ShareSystem got (systemSharingGuest).
	systemShares []string
	stopped      bool
	// restored is what Restored says; discarded counts DiscardSnapshot.
	restored  bool
	discarded int
	// reclaims and releases count MemoryReclaimer's calls.
	reclaims, releases int
	// prepared and saved count Suspender's calls (suspendingGuest);
	// resumed is what Resumed says.
	prepared, saved int
	resumed         bool
	err             error
	done            chan struct{}
	once            sync.Once
}

func (g *fakeGuest) Agent(ctx context.Context) (io.ReadWriteCloser, error) { return g.helperEnd, nil }

// Share shares as the process backend does (a file's source is its
// directory) and records the host path it got.
func (g *fakeGuest) Share(hostPath string, readOnly bool) (protocol.MountSource, error) {
	src := protocol.MountSource{Kind: "bind", Path: hostPath}
	if fi, err := os.Stat(hostPath); err == nil && fi.Mode().IsRegular() {
		src.Path = filepath.Dir(hostPath)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sharedPaths = append(g.sharedPaths, hostPath)
	g.shares = append(g.shares, src)
	return src, nil
}

// Unshare records the withdrawal of src.
func (g *fakeGuest) Unshare(src protocol.MountSource) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.unshares = append(g.unshares, src)
}

// shareState returns what Share got and what Unshare withdrew so far.
func (g *fakeGuest) shareState() (sharedPaths []string, unshares []protocol.MountSource) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.sharedPaths), slices.Clone(g.unshares)
}

func (g *fakeGuest) Done() <-chan struct{} { return g.done }

// Restored implements Restorable.
func (g *fakeGuest) Restored() bool { return g.restored }

// DiscardSnapshot implements Restorable: it counts the calls.
func (g *fakeGuest) DiscardSnapshot() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.discarded++
}

// discards returns how often DiscardSnapshot was called.
func (g *fakeGuest) discards() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.discarded
}

func (g *fakeGuest) Egress() net.Listener { return g.egress }

func (g *fakeGuest) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// die ends the guest as a crash would.
func (g *fakeGuest) die(err error) { g.end(err, true) }

// endLeavingConn ends the guest as a VM whose kernel panicked does: its
// agent connection stays open until Stop.
func (g *fakeGuest) endLeavingConn(err error) { g.end(err, false) }

// end records err as the guest's end, closes its agent's side of the
// connection if closeConn, and closes done; only the first end counts.
func (g *fakeGuest) end(err error, closeConn bool) {
	g.once.Do(func() {
		g.mu.Lock()
		g.err = err
		g.mu.Unlock()
		if closeConn {
			g.agent.conn.Close()
		}
		close(g.done)
	})
}

func (g *fakeGuest) Stop(ctx context.Context) error {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.end(nil, true) // a guest that ended already keeps its reason
	return nil
}

// fakeAgent answers the helper's requests and records them.
type fakeAgent struct {
	conn   net.Conn
	guest  *fakeGuest
	server *agentrpc.Server

	mu         sync.Mutex
	setup      *protocol.SetupParams
	mounts     map[string]protocol.Mount // by target
	spawns     map[string]protocol.SpawnParams
	running    map[string]bool
	stdin      map[string]string
	files      map[string][]byte
	ignorePing bool
	// ignoredPings counts the pings ignorePing left unanswered.
	ignoredPings int
	// holdSetup leaves setup unanswered, as an agent whose guest hangs.
	holdSetup bool
	// delayPing delays the answer to the next ping that much (once).
	delayPing time.Duration
	pings     int // pings answered
	spawnErr  string
	mountErr  string
	// unmounts are the targets the helper unmounted, in order.
	unmounts []string
	// asked are the guest requests emitted (request) and not yet answered;
	// answers what guestResponse brought for each.
	asked   map[uint64]bool
	answers map[uint64]protocol.GuestResponseParams
	// credits is the output credit of processes spawned with a window
	// (emitOutput); creditChanged is closed and replaced when some comes.
	credits       map[string]int64
	creditChanged chan struct{}
	// readGate, while set, holds the agent's reads (stopReading).
	readGate chan struct{}
	// refuseSuspend fails suspend; suspends, resumes and shutdowns count
	// the requests served.
	refuseSuspend                bool
	suspends, resumes, shutdowns int
}

// stopReading makes the agent stop reading its connection, as a hung or
// hostile guest does: the helper's writes to it stall (a read already
// waiting takes the first bytes of the next frame). resumeReading ends it.
func (a *fakeAgent) stopReading() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.readGate == nil {
		a.readGate = make(chan struct{})
	}
}

func (a *fakeAgent) resumeReading() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.readGate != nil {
		close(a.readGate)
		a.readGate = nil
	}
}

// gatedConn is the agent's connection, read unless it stopped reading.
type gatedConn struct{ a *fakeAgent }

func (r gatedConn) Write(p []byte) (int, error) { return r.a.conn.Write(p) }
func (r gatedConn) Close() error                { return r.a.conn.Close() }

func (r gatedConn) Read(p []byte) (int, error) {
	r.a.mu.Lock()
	gate := r.a.readGate
	r.a.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return r.a.conn.Read(p)
}

func newFakeAgent(conn net.Conn, g *fakeGuest) *fakeAgent {
	a := &fakeAgent{
		conn: conn, guest: g,
		mounts:  map[string]protocol.Mount{},
		spawns:  map[string]protocol.SpawnParams{},
		running: map[string]bool{},
		stdin:   map[string]string{},
		files:   map[string][]byte{},
		asked:   map[uint64]bool{},
		answers: map[uint64]protocol.GuestResponseParams{},
		credits: map[string]int64{}, creditChanged: make(chan struct{}),
	}
	a.server = agentrpc.NewServer(gatedConn{a}, a.methods(), agentrpc.ServerOptions{Final: []string{protocol.AgentMethodShutdown, protocol.AgentMethodSuspend}})
	return a
}

// emitOutput sends data as stdout of process id in events of chunk bytes,
// within the process's credit as the real agent does: an event goes while
// the credit is above zero (a process spawned without a window sends
// freely).
func (a *fakeAgent) emitOutput(id string, data string, chunk int) {
	for len(data) > 0 {
		n := min(chunk, len(data))
		for {
			a.mu.Lock()
			credit, limited := a.credits[id]
			ok := !limited || credit > 0
			if ok && limited {
				a.credits[id] -= protocol.OutputCost(n)
			}
			changed := a.creditChanged
			a.mu.Unlock()
			if ok {
				break
			}
			<-changed
		}
		a.emit(protocol.Event{Type: protocol.EventStdout, ID: id, Data: data[:n]})
		data = data[n:]
	}
}

// emit sends an event as the agent would.
func (a *fakeAgent) emit(ev protocol.Event) { _ = a.server.Emit(ev) }

func (a *fakeAgent) exit(id string, code int) {
	a.mu.Lock()
	delete(a.running, id)
	a.mu.Unlock()
	a.emit(protocol.Event{Type: protocol.EventExit, ID: id, ExitCode: &code})
}

// exitOOM reports an exit with an oomKillCount, as the agent does for a
// spawn with a cgroup.
func (a *fakeAgent) exitOOM(id string, code, oomKills int) {
	a.mu.Lock()
	delete(a.running, id)
	a.mu.Unlock()
	a.emit(protocol.Event{Type: protocol.EventExit, ID: id, ExitCode: &code, OOMKillCount: &oomKills})
}

// request emits a guest request of process id, as the agent does for a
// call on its guest-request socket.
func (a *fakeAgent) request(id string, g protocol.GuestRequest) {
	a.mu.Lock()
	a.asked[g.ID] = true
	a.mu.Unlock()
	a.emit(protocol.Event{Type: protocol.EventRequest, ID: id, GuestRequest: &g})
}

// answer returns what guestResponse brought for request id, if it came.
func (a *fakeAgent) answer(id uint64) (protocol.GuestResponseParams, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.answers[id]
	return r, ok
}

// unmounted returns the targets unmounted so far.
func (a *fakeAgent) unmounted() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.unmounts)
}

func (a *fakeAgent) serve() {
	hello := protocol.AgentHello{Version: protocol.AgentProtocolVersion, Kernel: "fake", PID: 1}
	if a.server.SendHello(hello) == nil {
		_ = a.server.Serve(context.Background())
	}
}

// methods are the agent's requests as the fake serves them. A request it
// leaves unanswered (holdSetup, ignorePing) waits for the connection's end.
func (a *fakeAgent) methods() map[string]agentrpc.Handler {
	return map[string]agentrpc.Handler{
		protocol.AgentMethodSetup: agentrpc.Handle(a.handleSetup),
		protocol.AgentMethodMount: agentrpc.HandleNoResult(func(_ context.Context, p protocol.MountParams) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.mountErr != "" {
				return errors.New(a.mountErr)
			}
			a.mounts[p.Mount.Target] = p.Mount
			return nil
		}),
		protocol.AgentMethodSpawn: agentrpc.HandleNoResult(a.handleSpawn),
		protocol.AgentMethodCredit: agentrpc.HandleNoResult(func(_ context.Context, p protocol.CreditParams) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.credits[p.ID] += p.Bytes
			close(a.creditChanged)
			a.creditChanged = make(chan struct{})
			return nil
		}),
		protocol.AgentMethodStdin: agentrpc.HandleNoResult(func(_ context.Context, p protocol.StdinParams) error {
			a.mu.Lock()
			a.stdin[p.ID] += p.Data
			a.mu.Unlock()
			a.emit(protocol.Event{Type: protocol.EventStdout, ID: p.ID, Data: p.Data})
			if p.EOF { // a cat ends with its input
				a.exit(p.ID, 0)
			}
			return nil
		}),
		protocol.AgentMethodKill: agentrpc.HandleNoResult(a.handleKill),
		protocol.AgentMethodUnmount: agentrpc.HandleNoResult(func(_ context.Context, p protocol.UnmountParams) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.unmountLocked(p)
		}),
		protocol.AgentMethodGuestResponse: agentrpc.HandleNoResult(func(_ context.Context, p protocol.GuestResponseParams) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.answerLocked(p)
		}),
		protocol.AgentMethodReadFile: agentrpc.Handle(func(_ context.Context, p protocol.ReadFileParams) (*protocol.ReadFileResult, error) {
			a.mu.Lock()
			defer a.mu.Unlock()
			content, ok := a.files[p.Path]
			if !ok {
				return nil, errors.New("open " + p.Path + ": no such file or directory")
			}
			return &protocol.ReadFileResult{Content: content}, nil
		}),
		protocol.AgentMethodPing:     a.handlePing,
		protocol.AgentMethodShutdown: agentrpc.HandleNoResult(a.handleShutdown),
		protocol.AgentMethodSuspend: agentrpc.HandleNoResult(func(ctx context.Context, p protocol.SuspendParams) error {
			a.mu.Lock()
			refuse := a.refuseSuspend
			a.mu.Unlock()
			if refuse {
				return errors.New("a mount would not go")
			}
			a.endAll()
			a.mu.Lock()
			a.suspends++
			a.mu.Unlock()
			return nil
		}),
		protocol.AgentMethodResume: agentrpc.Handle(func(_ context.Context, p protocol.ResumeParams) (json.RawMessage, error) {
			a.mu.Lock()
			a.resumes++
			a.mu.Unlock()
			return json.RawMessage(`{"rootDisk":"mounted","steps":[{"name":"clock","us":1}]}`), nil
		}),
	}
}

// counts returns how many suspends, resumes and shutdowns were served.
func (a *fakeAgent) counts() (suspends, resumes, shutdowns int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.suspends, a.resumes, a.shutdowns
}

func (a *fakeAgent) handleSetup(ctx context.Context, p protocol.SetupParams) (json.RawMessage, error) {
	a.mu.Lock()
	a.setup = &p
	hold := a.holdSetup
	a.mu.Unlock()
	if hold {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return json.RawMessage(`{"steps":[{"name":"mount:/usr","us":1}]}`), nil
}

func (a *fakeAgent) handleSpawn(_ context.Context, p protocol.SpawnParams) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.spawnErr != "" {
		return errors.New(a.spawnErr)
	}
	a.spawns[p.ID] = p
	a.running[p.ID] = true
	if p.OutputWindow > 0 {
		a.credits[p.ID] = p.OutputWindow
	}
	return nil
}

func (a *fakeAgent) handleKill(_ context.Context, p protocol.KillParams) error {
	a.mu.Lock()
	running := a.running[p.ID]
	delete(a.running, p.ID)
	a.mu.Unlock()
	if !running {
		return errors.New("no such process")
	}
	a.emit(protocol.Event{Type: protocol.EventExit, ID: p.ID, Signal: p.Signal})
	return nil
}

func (a *fakeAgent) handlePing(ctx context.Context, _ json.RawMessage) (any, error) {
	a.mu.Lock()
	if a.ignorePing {
		a.ignoredPings++
		a.mu.Unlock()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	a.pings++
	d := a.delayPing
	a.delayPing = 0
	a.mu.Unlock()
	time.Sleep(d)
	return nil, nil
}

// handleShutdown ends every process, as the agent does before its reply
// (the server then closes the connection: the method is Final).
func (a *fakeAgent) handleShutdown(_ context.Context, _ protocol.ShutdownParams) error {
	a.endAll()
	a.mu.Lock()
	a.shutdowns++
	a.mu.Unlock()
	return nil
}

// endAll ends every process with SIGTERM, its exit event sent.
func (a *fakeAgent) endAll() {
	a.mu.Lock()
	ids := slices.Collect(maps.Keys(a.running))
	a.running = map[string]bool{}
	a.mu.Unlock()
	for _, id := range ids {
		a.emit(protocol.Event{Type: protocol.EventExit, ID: id, Signal: "SIGTERM"})
	}
}

// unmountLocked is the unmount method: what is at and below the target
// goes; the error is the reply's.
func (a *fakeAgent) unmountLocked(p protocol.UnmountParams) error {
	if _, ok := a.mounts[p.Target]; !ok {
		return errors.New("nothing the agent mounted is at " + p.Target)
	}
	a.unmounts = append(a.unmounts, p.Target)
	for t := range a.mounts {
		if t == p.Target || strings.HasPrefix(t, p.Target+"/") {
			delete(a.mounts, t)
		}
	}
	return nil
}

// answerLocked is the guestResponse method: the answer to a request asked
// and not answered yet is kept.
func (a *fakeAgent) answerLocked(p protocol.GuestResponseParams) error {
	if !a.asked[p.ID] {
		return errors.New("no guest request of that id is waiting")
	}
	delete(a.asked, p.ID)
	a.answers[p.ID] = p
	return nil
}

func (a *fakeAgent) mountAt(target string) (protocol.Mount, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, ok := a.mounts[target]
	return m, ok
}

func (a *fakeAgent) spawned(id string) (protocol.SpawnParams, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.spawns[id]
	return p, ok
}

// waitFor polls cond until it holds; the deadline only guards against a
// hang, it is not what the test measures.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var errCrash = errors.New("guest crashed")

// idleListener is an egress listener no connection ever arrives on.
type idleListener struct {
	once   sync.Once
	closed chan struct{}
}

func newIdleListener() *idleListener { return &idleListener{closed: make(chan struct{})} }

func (l *idleListener) Accept() (net.Conn, error) {
	<-l.closed
	return nil, net.ErrClosed
}

func (l *idleListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *idleListener) Addr() net.Addr { return &net.UnixAddr{Name: "idle-egress", Net: "unix"} }
