package helper

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

type testEnv struct {
	t *testing.T
	h *Helper
	// s is the profile of the test's connection (ctx): testProfile.
	s       *Service
	ctx     context.Context
	backend *fakeBackend
	sub     *Subscription
	sysDir  string
}

// The profile a testEnv's connection configures, as the client's pipe does.
const testProfile, testProfileRoot = "profile", "/root"

func newTestEnv(t *testing.T) *testEnv { return newTestEnvWith(t, nil) }

// newTestEnvWith lets a test adjust the Options before New.
func newTestEnvWith(t *testing.T, adjust func(*Options)) *testEnv {
	t.Helper()
	backend := &fakeBackend{t: t}
	sys := t.TempDir()
	opts := Options{
		Backend:      "fake",
		Backends:     map[string]BackendFactory{"fake": func() (Backend, error) { return backend, nil }},
		DataDir:      t.TempDir(),
		SystemDirs:   []string{sys, filepath.Join(sys, "missing")},
		StopGrace:    1,
		NetworkCheck: func(context.Context) string { return protocol.NetworkConnected },
		ProbeClient:  answeringProbe{},
	}
	if adjust != nil {
		adjust(&opts)
	}
	h, err := New(opts)
	require.NoError(t, err)
	env := &testEnv{t: t, h: h, ctx: protocol.WithConnState(context.Background()), backend: backend, sysDir: sys}
	t.Cleanup(func() {
		if env.sub != nil {
			env.sub.Close()
		}
		require.NoError(t, h.Close(context.Background()))
	})
	env.mustCall("configure", map[string]any{"userDataName": testProfile, "userDataRoot": testProfileRoot, "sessionOnly": true}, nil)
	env.s, err = h.Profile(testProfile, testProfileRoot)
	require.NoError(t, err)
	env.sub = env.s.hub.Subscribe()
	return env
}

// call runs a method on the test's connection with params given as a Go
// value and decodes the result.
func (e *testEnv) call(method string, params any, result any) error {
	e.t.Helper()
	return callOn(e.t, e.h, e.ctx, method, params, result)
}

// callOn runs a method through h on ctx's connection.
func callOn(t *testing.T, h *Helper, ctx context.Context, method string, params any, result any) error {
	t.Helper()
	var raw json.RawMessage
	if params != nil {
		b, err := json.Marshal(params)
		require.NoError(t, err)
		raw = b
	}
	res, err := h.Call(ctx, method, raw)
	if err != nil {
		return err
	}
	if result != nil {
		require.NotNil(t, res, "%s returned no result", method)
		b, err := json.Marshal(res)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, result))
	}
	return nil
}

func (e *testEnv) mustCall(method string, params any, result any) {
	e.t.Helper()
	require.NoError(e.t, e.call(method, params, result), method)
}

// next returns the next event of the given type, skipping others.
func (e *testEnv) next(types ...string) protocol.Event {
	e.t.Helper()
	for {
		ev, err := e.sub.Next(e.t.Context())
		require.NoError(e.t, err)
		if slices.Contains(types, ev.Type) {
			return ev
		}
	}
}

func (e *testEnv) start() *fakeGuest {
	e.t.Helper()
	startOn(e.t, e.h, e.ctx)
	return e.backend.last()
}

// startOn boots the guest of ctx's profile and waits until it is connected.
func startOn(t *testing.T, h *Helper, ctx context.Context) {
	t.Helper()
	require.NoError(t, callOn(t, h, ctx, "startVM", map[string]any{"bundlePath": "/nonexistent"}, nil))
	waitFor(t, "guest connected", func() bool {
		var r protocol.IsGuestConnectedResult
		require.NoError(t, callOn(t, h, ctx, "isGuestConnected", nil, &r))
		return r.Connected
	})
}

func (e *testEnv) spawn(params map[string]any) protocol.SpawnResult {
	e.t.Helper()
	var r protocol.SpawnResult
	e.mustCall("spawn", params, &r)
	return r
}

func TestUnknownMethod(t *testing.T) {
	e := newTestEnv(t)
	err := e.call("frobnicate", nil, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Unknown method: frobnicate")
}

func TestMethodsAreTheContract(t *testing.T) {
	e := newTestEnv(t)
	want := []string{"addApprovedOauthToken", "configure", "createVM", "deleteSessionDirs", "getNetworkDrives",
		"getSessionsDiskInfo", "installSdk", "isGuestConnected", "isProcessRunning", "isRunning", "kill",
		"mountPath", "pruneSessionCaches", "readFile", "sendGuestResponse", "setDebugLogging", "spawn",
		"startVM", "stopVM", "subscribeEvents", "writeStdin"}
	assert.Equal(t, want, e.s.Methods())
}

func TestInvalidParams(t *testing.T) {
	e := newTestEnv(t)
	_, err := e.s.Call(context.Background(), "kill", json.RawMessage(`[1,2]`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid params")
}

func TestIdleMethods(t *testing.T) {
	e := newTestEnv(t)
	var running protocol.IsRunningResult
	e.mustCall("isRunning", nil, &running)
	assert.False(t, running.Running)
	var conn protocol.IsGuestConnectedResult
	e.mustCall("isGuestConnected", nil, &conn)
	assert.False(t, conn.Connected)
	e.mustCall("stopVM", nil, nil) // nothing runs: still succeeds
	e.mustCall("configure", map[string]any{"userDataName": "p", "userDataRoot": "/r", "memoryMB": 2048, "cpuCount": 3}, nil)
	e.mustCall("configure", map[string]any{"userDataName": "p", "userDataRoot": "/r", "sessionOnly": true}, nil)
	e.mustCall("createVM", map[string]any{"bundlePath": "/b", "diskSizeGB": 10}, nil)
	assert.ErrorContains(t, e.call("sendGuestResponse", map[string]any{"id": "x", "resultJson": "{}"}, nil), "no guest request", "an id never asked")
	var drives map[string]any
	e.mustCall("getNetworkDrives", nil, &drives)
	assert.Equal(t, map[string]any{"drives": []any{}}, drives)
	var pr protocol.IsProcessRunningResult
	e.mustCall("isProcessRunning", map[string]any{"id": "nobody"}, &pr)
	assert.Equal(t, protocol.IsProcessRunningResult{}, pr)
	require.Error(t, e.call("subscribeEvents", nil, nil))

	res, err := e.s.Call(context.Background(), "stopVM", nil)
	require.NoError(t, err)
	assert.Nil(t, res, "methods without a result reply without one")
}

func TestConfigureDefaultsReachTheBackend(t *testing.T) {
	e := newTestEnv(t)
	e.mustCall("configure", map[string]any{"userDataName": "p", "userDataRoot": "/r", "memoryMB": 2048, "cpuCount": 3}, nil)
	g := e.start()
	assert.Equal(t, 2048, g.cfg.MemoryMiB)
	assert.Equal(t, 3, g.cfg.CPUCount)
}

func TestSetDebugLogging(t *testing.T) {
	e := newTestEnv(t)
	var level struct{ v slog.LevelVar }
	e.s.opts.LogLevel = &level.v
	e.mustCall("setDebugLogging", map[string]any{"enabled": true}, nil)
	assert.Equal(t, "DEBUG", level.v.Level().String())
	e.mustCall("setDebugLogging", map[string]any{"enabled": false}, nil)
	assert.Equal(t, "INFO", level.v.Level().String())
}

// testFallbackHint is a FallbackHint as the binary sets it.
const testFallbackHint = "; on a host without usable KVM, set COWORK_VMM_BACKEND=process to run guests as sandboxed host processes"

func TestStartVMWithoutBackend(t *testing.T) {
	s, err := New(Options{DataDir: t.TempDir(), Backends: map[string]BackendFactory{"process": nil}, FallbackHint: testFallbackHint})
	require.NoError(t, err)
	_, err = s.Call(context.Background(), "startVM", nil)
	require.Error(t, err)
	assert.Equal(t, "the kvm backend is not in this build (COWORK_VMM_BACKEND; available backends: none in this build)"+testFallbackHint, err.Error())
	res, err := s.Call(context.Background(), "isRunning", nil)
	require.NoError(t, err)
	assert.Equal(t, protocol.IsRunningResult{}, res)
}

// failingBackend fails every start with err.
type failingBackend struct{ err error }

func (b failingBackend) Name() string { return BackendKVM }

// AttachesRootDisk implements RootDiskAttacher, as a VM backend does.
func (b failingBackend) AttachesRootDisk() bool { return true }
func (b failingBackend) Start(context.Context, GuestConfig) (Guest, error) {
	return nil, b.err
}

func TestStartVMNamesTheProcessBackendOnce(t *testing.T) {
	for _, backendErr := range []error{
		errors.New("no KVM device"),
		errors.New("this KVM is PVM; set COWORK_VMM_BACKEND=process to run guests as host processes"),
	} {
		s, err := New(Options{DataDir: t.TempDir(), Backend: BackendKVM, FallbackHint: testFallbackHint, Backends: map[string]BackendFactory{
			BackendKVM:     func() (Backend, error) { return failingBackend{backendErr}, nil },
			BackendProcess: func() (Backend, error) { return failingBackend{backendErr}, nil },
		}})
		require.NoError(t, err)
		_, err = s.Call(context.Background(), "startVM", nil)
		require.Error(t, err)
		assert.Equal(t, 1, strings.Count(err.Error(), "COWORK_VMM_BACKEND=process"), err.Error())
	}
}

func TestStartVMBackendFailure(t *testing.T) {
	e := newTestEnv(t)
	e.backend.startErr = os.ErrPermission
	err := e.call("startVM", nil, nil)
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrPermission)
	var running protocol.IsRunningResult
	e.mustCall("isRunning", nil, &running)
	assert.False(t, running.Running)
	// The launch step says it failed, never that it completed.
	var launch []string
	for {
		ev := e.next(protocol.EventStartupStep)
		if ev.Step == StepLaunchGuest {
			if launch = append(launch, ev.Status); len(launch) == 2 {
				break
			}
		}
	}
	assert.Equal(t, []string{protocol.StepStarted, protocol.StepFailed}, launch)
	e.backend.startErr = nil
	e.start() // a later start works
}

// A backend whose guest has no egress listener cannot start: its
// processes would silently have no network.
func TestStartVMRefusesAGuestWithoutEgress(t *testing.T) {
	e := newTestEnv(t)
	e.backend.noEgress = true
	err := e.call("startVM", nil, nil)
	require.ErrorContains(t, err, "no egress channel")
	var running protocol.IsRunningResult
	e.mustCall("isRunning", nil, &running)
	assert.False(t, running.Running)
	e.backend.mu.Lock()
	g := e.backend.guests[len(e.backend.guests)-1]
	e.backend.mu.Unlock()
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the refused guest was not stopped")
	}
}

func TestStartVMEvents(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	steps := map[string][]string{}
	var reach, netStatus string
	for reach == "" || netStatus == "" || len(steps[StepConnectAgent]) < 2 {
		ev := e.next(protocol.EventStartupStep, protocol.EventAPIReachability, protocol.EventNetworkStatus)
		switch ev.Type {
		case protocol.EventStartupStep:
			require.NotEmpty(t, ev.Step)
			steps[ev.Step] = append(steps[ev.Step], ev.Status)
		case protocol.EventAPIReachability:
			reach = ev.Status
		case protocol.EventNetworkStatus:
			netStatus = ev.Status
		}
	}
	assert.Equal(t, []string{"started", "completed"}, steps[StepLaunchGuest])
	assert.Equal(t, []string{"started", "completed"}, steps[StepConnectAgent])
	assert.Equal(t, []string{"started", "completed"}, steps[StepAgentHello], "connect_agent's sub-steps are published")
	assert.Equal(t, []string{"started", "completed"}, steps[StepGuestSetup])
	assert.Equal(t, protocol.ReachabilityUnknown, reach, "no apiProbeURL: unknown")
	assert.Equal(t, protocol.NetworkConnected, netStatus)

	// Setup: the system dirs that exist, read-only, on a fresh root.
	g.agent.mu.Lock()
	setup := g.agent.setup
	g.agent.mu.Unlock()
	require.NotNil(t, setup)
	require.Len(t, setup.System, 1)
	assert.Equal(t, e.sysDir, setup.System[0].Target)
	assert.True(t, setup.System[0].ReadOnly)
	var running protocol.IsRunningResult
	e.mustCall("isRunning", nil, &running)
	assert.True(t, running.Running)
	e.mustCall("startVM", nil, nil) // already running: no second guest
	assert.Len(t, e.backend.guests, 1)
}

func TestStartVMSharesSystemDirsThroughSystemSharer(t *testing.T) {
	for _, sharer := range []bool{false, true} {
		t.Run(map[bool]string{false: "Share", true: "ShareSystem"}[sharer], func(t *testing.T) {
			e := newTestEnv(t)
			e.backend.systemSharer = sharer
			g := e.start()
			g.agent.mu.Lock()
			setup := g.agent.setup
			g.agent.mu.Unlock()
			require.NotNil(t, setup)
			require.Len(t, setup.System, 1)
			sys := setup.System[0]
			assert.Equal(t, e.sysDir, sys.Target)
			assert.True(t, sys.ReadOnly)
			g.mu.Lock()
			shares, systemShares := g.shares, g.systemShares
			g.mu.Unlock()
			if sharer {
				assert.Equal(t, []string{e.sysDir}, systemShares, "system dirs go through ShareSystem")
				assert.Empty(t, shares, "no system dir through Share")
				assert.Equal(t, protocol.MountSource{Kind: "9p", Tag: fakeSystemTag, Aname: "sys1", Cache: protocol.NinePCacheLoose}, sys.Source)
			} else {
				assert.Empty(t, systemShares)
				assert.Equal(t, []protocol.MountSource{{Kind: "bind", Path: e.sysDir}}, shares)
				assert.Equal(t, protocol.MountSource{Kind: "bind", Path: e.sysDir}, sys.Source)
			}
		})
	}
}

func TestStartVMProbesAPI(t *testing.T) {
	e := newTestEnv(t)
	e.mustCall("startVM", map[string]any{"apiProbeURL": "http://127.0.0.1:1/"}, nil)
	ev := e.next(protocol.EventAPIReachability)
	assert.Equal(t, protocol.ReachabilityReachable, ev.Status)
}

func TestSpawnFlow(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	host := t.TempDir()
	rwSrc := filepath.Join(host, "work", "new") // missing: created
	roSrc := filepath.Join(host, "ro")
	require.NoError(t, os.Mkdir(roSrc, 0o755))
	e.mustCall("addApprovedOauthToken", map[string]any{"token": "approved"}, nil)

	res := e.spawn(map[string]any{
		"id": "p1", "name": "sess", "command": "/usr/local/bin/claude", "args": []string{"-p", "hi"},
		"isResume": false, "env": map[string]string{"FOO": "bar", "LANG": "en_US.UTF-8"},
		"oauthToken": "tok",
		"additionalMounts": map[string]any{
			"work":          map[string]string{"path": strings.TrimPrefix(rwSrc, "/"), "mode": "rw"},
			"ro":            map[string]string{"path": strings.TrimPrefix(roSrc, "/"), "mode": "ro"},
			"missing":       map[string]string{"path": strings.TrimPrefix(filepath.Join(host, "nope"), "/"), "mode": "ro"},
			".claude/skill": map[string]string{"path": strings.TrimPrefix(host, "/"), "mode": ""},
			"../escape":     map[string]string{"path": "tmp", "mode": "rw"},
			"badmode":       map[string]string{"path": "tmp", "mode": "rwx"},
		},
	})
	assert.Equal(t, []string{"../escape", "badmode", "missing"}, res.FailedMounts)
	assert.DirExists(t, rwSrc)

	sp, ok := g.agent.spawned("p1")
	require.True(t, ok)
	assert.Equal(t, "/usr/local/bin/claude", sp.Command)
	assert.Equal(t, []string{"-p", "hi"}, sp.Args)
	assert.Equal(t, "/sessions/sess", sp.Cwd)
	assert.Contains(t, sp.Env, "FOO=bar")
	assert.Contains(t, sp.Env, "LANG=en_US.UTF-8")
	assert.Contains(t, sp.Env, "HOME=/sessions/sess")
	assert.Contains(t, sp.Env, "CLAUDE_CODE_OAUTH_TOKEN=tok")
	assert.Contains(t, sp.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")

	assertSpawnFlowMounts(t, e, g, rwSrc)

	// Output and exit events come through, validated.
	g.agent.emit(protocol.Event{Type: protocol.EventStdout, ID: "p1", Data: "out"})
	g.agent.emit(protocol.Event{Type: protocol.EventStdout, ID: "stranger", Data: "dropped"})
	g.agent.emit(protocol.Event{Type: protocol.EventStderr, ID: "p1", Data: "err"})
	ev := e.next(protocol.EventStdout, protocol.EventStderr)
	assert.Equal(t, protocol.Event{Type: "stdout", ID: "p1", Data: "out"}, ev)
	ev = e.next(protocol.EventStdout, protocol.EventStderr)
	assert.Equal(t, protocol.Event{Type: "stderr", ID: "p1", Data: "err"}, ev)

	var pr protocol.IsProcessRunningResult
	e.mustCall("isProcessRunning", map[string]any{"id": "p1"}, &pr)
	assert.True(t, pr.Running)

	e.mustCall("writeStdin", map[string]any{"id": "p1", "data": "line\n"}, nil)
	ev = e.next(protocol.EventStdout)
	assert.Equal(t, "line\n", ev.Data)

	// A second spawn in the session with the same mounts mounts nothing new;
	// the approved token is used when none is given.
	e.spawn(map[string]any{"id": "p2", "name": "sess", "command": "sh", "cwd": "/sessions/sess/mnt/work/"})
	sp, _ = g.agent.spawned("p2")
	assert.Contains(t, sp.Env, "CLAUDE_CODE_OAUTH_TOKEN=approved")
	assert.Equal(t, "/sessions/sess/mnt/work", sp.Cwd)
	// env wins over the token.
	e.spawn(map[string]any{"id": "p3", "name": "sess", "command": "sh", "oauthToken": "tok", "env": map[string]string{"CLAUDE_CODE_OAUTH_TOKEN": "mine"}})
	sp, _ = g.agent.spawned("p3")
	assert.Contains(t, sp.Env, "CLAUDE_CODE_OAUTH_TOKEN=mine")
	assert.NotContains(t, sp.Env, "CLAUDE_CODE_OAUTH_TOKEN=tok")

	require.Error(t, e.call("spawn", map[string]any{"id": "p1", "name": "sess", "command": "sh"}, nil), "duplicate running id")

	g.agent.exit("p1", 3)
	ev = e.next(protocol.EventExit)
	require.NotNil(t, ev.ExitCode)
	assert.Equal(t, "p1", ev.ID)
	assert.Equal(t, 3, *ev.ExitCode)
	e.mustCall("isProcessRunning", map[string]any{"id": "p1"}, &pr)
	assert.False(t, pr.Running)
	require.NotNil(t, pr.ExitCode)
	assert.Equal(t, 3, *pr.ExitCode)
	g.agent.exit("p1", 4) // a duplicate exit is dropped
	require.Error(t, e.call("writeStdin", map[string]any{"id": "p1", "data": "x"}, nil))

	e.mustCall("kill", map[string]any{"id": "p2", "signal": "SIGTERM"}, nil)
	ev = e.next(protocol.EventExit)
	assert.Equal(t, protocol.Event{Type: "exit", ID: "p2", Signal: "SIGTERM"}, ev)
	e.mustCall("kill", map[string]any{"id": "p2", "signal": "SIGTERM"}, nil) // already exited: fine
	require.Error(t, e.call("kill", map[string]any{"id": "p3", "signal": "SIGBOGUS"}, nil))
	require.Error(t, e.call("kill", map[string]any{"id": "nobody", "signal": "SIGTERM"}, nil))
}

// assertSpawnFlowMounts checks the mounts TestSpawnFlow's first spawn made.
func assertSpawnFlowMounts(t *testing.T, e *testEnv, g *fakeGuest, rwSrc string) {
	t.Helper()
	home, ok := g.agent.mountAt("/sessions/sess")
	require.True(t, ok)
	assert.Equal(t, filepath.Join(e.s.sessionsDir, "sess"), home.Source.Path)
	assert.False(t, home.ReadOnly)
	assert.DirExists(t, home.Source.Path)
	m, ok := g.agent.mountAt("/sessions/sess/mnt/work")
	require.True(t, ok)
	assert.Equal(t, rwSrc, m.Source.Path)
	assert.False(t, m.ReadOnly)
	m, ok = g.agent.mountAt("/sessions/sess/mnt/ro")
	require.True(t, ok)
	assert.True(t, m.ReadOnly)
	_, ok = g.agent.mountAt("/sessions/sess/mnt/.claude/skill")
	assert.True(t, ok)
}

// kill takes a signal as a name in any case, with or without SIG, or a
// number, and passes every Linux signal on by its name; an exit by a
// signal outside the old 22-name table is reported as itself.
func TestKillSignalForms(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	for i, tc := range []struct{ sent, passed string }{
		{"term", "SIGTERM"}, {"9", "SIGKILL"}, {"SigUsr1", "SIGUSR1"}, {"SIGPWR", "SIGPWR"}, {"35", "SIG35"}, {"", "SIGTERM"},
	} {
		id := "k" + strconv.Itoa(i)
		e.spawn(map[string]any{"id": id, "name": "sess", "command": "sh"})
		e.mustCall("kill", map[string]any{"id": id, "signal": tc.sent}, nil)
		ev := e.next(protocol.EventExit)
		assert.Equal(t, protocol.Event{Type: "exit", ID: id, Signal: tc.passed}, ev, "kill %q", tc.sent)
	}
	e.spawn(map[string]any{"id": "bad", "name": "sess", "command": "sh"})
	for _, bad := range []string{"SIGBOGUS", "0", "65", "-9"} {
		require.Error(t, e.call("kill", map[string]any{"id": "bad", "signal": bad}, nil), bad)
	}
	// A hostile guest's made-up signal name is reported as a kill.
	g.agent.emit(protocol.Event{Type: protocol.EventExit, ID: "bad", Signal: "SIGNOTREAL"})
	assert.Equal(t, "SIGKILL", e.next(protocol.EventExit).Signal)
	var pr struct {
		ExitCode *int `json:"exitCode"`
	}
	e.mustCall("isProcessRunning", map[string]any{"id": "k3"}, &pr)
	require.NotNil(t, pr.ExitCode)
	assert.Equal(t, 128+30, *pr.ExitCode, "SIGPWR is 30: 128+30 as a shell reports it")
}

func TestSpawnRefusals(t *testing.T) {
	e := newTestEnv(t)
	require.ErrorContains(t, e.call("spawn", map[string]any{"id": "p", "name": "s", "command": "sh"}, nil), "startVM")
	g := e.start()
	for _, name := range []string{"", "a/b", "..", "../x", "x..y"} {
		require.Error(t, e.call("spawn", map[string]any{"id": "p", "name": name, "command": "sh"}, nil), name)
	}
	require.Error(t, e.call("spawn", map[string]any{"id": "", "name": "s", "command": "sh"}, nil))
	require.Error(t, e.call("spawn", map[string]any{"id": "p", "name": "s", "command": ""}, nil))
	require.Error(t, e.call("spawn", map[string]any{"id": "p", "name": "s", "command": "sh", "cwd": "relative"}, nil))
	require.Error(t, e.call("spawn", map[string]any{"id": "p", "name": "s", "command": "sh", "env": map[string]string{"A=B": "c"}}, nil))
	g.agent.mu.Lock()
	g.agent.spawnErr = "exec: not found"
	g.agent.mu.Unlock()
	require.ErrorContains(t, e.call("spawn", map[string]any{"id": "p", "name": "s", "command": "nope"}, nil), "not found")
	var pr protocol.IsProcessRunningResult
	e.mustCall("isProcessRunning", map[string]any{"id": "p"}, &pr)
	assert.False(t, pr.Running, "a failed spawn leaves no running process")
}

func TestReadFile(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "proc-1", "name": "s", "command": "sh"}) // the session is in the guest
	g.agent.mu.Lock()
	g.agent.files["/sessions/s/mnt/out/a.bin"] = []byte{0, 1, 2, 0xff}
	g.agent.mu.Unlock()
	var r struct {
		Content string `json:"content"` // base64 on the wire
	}
	e.mustCall("readFile", map[string]any{"processName": "s", "filePath": "/sessions/s/mnt/out/./a.bin"}, &r)
	got, err := base64.StdEncoding.DecodeString(r.Content)
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 1, 2, 0xff}, got)
	e.mustCall("readFile", map[string]any{"processName": "s", "filePath": "mnt/out/a.bin"}, &r)
	got, _ = base64.StdEncoding.DecodeString(r.Content)
	assert.Equal(t, []byte{0, 1, 2, 0xff}, got, "a relative path is taken in the session's home")
	for _, p := range []string{"/sessions/s/../t/a", "/etc/passwd", "/sessions/s", "/sessions/st/a", "../t/a", "", ".", "/sessions/s/../../etc/passwd"} {
		require.Error(t, e.call("readFile", map[string]any{"processName": "s", "filePath": p}, nil), p)
	}
	require.Error(t, e.call("readFile", map[string]any{"processName": "../s", "filePath": "/sessions/../s/a"}, nil))
	// A process id where the session name belongs is mapped to its session.
	e.mustCall("readFile", map[string]any{"processName": "proc-1", "filePath": "/sessions/s/mnt/out/a.bin"}, &r)
	got, _ = base64.StdEncoding.DecodeString(r.Content)
	assert.Equal(t, []byte{0, 1, 2, 0xff}, got)
	require.ErrorContains(t, e.call("readFile", map[string]any{"processName": "s", "filePath": "/sessions/s/missing"}, nil), "no such file")
}

func TestInstallSdk(t *testing.T) {
	e := newTestEnv(t)
	sdkRoot := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(sdkRoot, "1.2.3"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sdkRoot, "1.2.3", "claude"), []byte("#!/bin/sh\n"), 0o755))
	sub := strings.TrimPrefix(sdkRoot, "/")

	require.Error(t, e.call("installSdk", map[string]any{"sdkSubpath": sub, "version": "9.9.9"}, nil), "missing binary")
	require.Error(t, e.call("installSdk", map[string]any{"sdkSubpath": sub, "version": "../1.2.3"}, nil))
	// Before the guest runs: remembered, mounted at boot.
	e.mustCall("installSdk", map[string]any{"sdkSubpath": sub, "version": "1.2.3"}, nil)
	g := e.start()
	m, ok := g.agent.mountAt(GuestSDKPath)
	require.True(t, ok)
	assert.Equal(t, "claude", m.SourceFile)
	assert.Equal(t, filepath.Join(sdkRoot, "1.2.3"), m.Source.Path)
	assert.True(t, m.ReadOnly)

	// Into a running guest.
	require.NoError(t, os.MkdirAll(filepath.Join(sdkRoot, "2.0.0"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sdkRoot, "2.0.0", "claude"), []byte("#!/bin/sh\n"), 0o755))
	e.mustCall("installSdk", map[string]any{"sdkSubpath": "/" + sub, "version": "2.0.0"}, nil)
	m, _ = g.agent.mountAt(GuestSDKPath)
	assert.Equal(t, filepath.Join(sdkRoot, "2.0.0"), m.Source.Path)
}

func TestMountPath(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "p1", "name": "s", "command": "sh"})
	src := t.TempDir()
	e.mustCall("mountPath", map[string]any{"processId": "p1", "subpath": strings.TrimPrefix(src, "/"), "mountName": "extra/dir", "mode": "ro"}, nil)
	m, ok := g.agent.mountAt("/sessions/s/mnt/extra/dir")
	require.True(t, ok)
	assert.True(t, m.ReadOnly)
	require.Error(t, e.call("mountPath", map[string]any{"processId": "nobody", "subpath": "tmp", "mountName": "x", "mode": "rw"}, nil))
	require.Error(t, e.call("mountPath", map[string]any{"processId": "p1", "subpath": "tmp", "mountName": "../x", "mode": "rw"}, nil))
}

func TestStopVMEndsProcesses(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "a", "name": "s", "command": "sh"})
	e.spawn(map[string]any{"id": "b", "name": "s", "command": "sh"})
	e.mustCall("stopVM", nil, nil)
	got := map[string]string{}
	for len(got) < 2 {
		ev := e.next(protocol.EventExit)
		got[ev.ID] = ev.Signal
	}
	assert.Equal(t, map[string]string{"a": "SIGTERM", "b": "SIGTERM"}, got)
	var running protocol.IsRunningResult
	e.mustCall("isRunning", nil, &running)
	assert.False(t, running.Running)
	assert.True(t, g.stopped)
	var pr protocol.IsProcessRunningResult
	e.mustCall("isProcessRunning", map[string]any{"id": "a"}, &pr)
	assert.False(t, pr.Running)
}

func TestGuestDeath(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "a", "name": "s", "command": "sh"})
	g.die(errCrash)
	ev := e.next(protocol.EventError)
	require.NotNil(t, ev.Fatal)
	assert.True(t, *ev.Fatal)
	ev = e.next(protocol.EventExit)
	assert.Equal(t, "a", ev.ID)
	assert.Equal(t, "SIGKILL", ev.Signal)
	waitFor(t, "isRunning false", func() bool {
		var r protocol.IsRunningResult
		e.mustCall("isRunning", nil, &r)
		return !r.Running
	})
	var c protocol.IsGuestConnectedResult
	e.mustCall("isGuestConnected", nil, &c)
	assert.False(t, c.Connected)
	e.start() // a later start works
	assert.Len(t, e.backend.guests, 2)
}

// startHeldAtSetup starts a guest (restored from a snapshot, or not)
// whose agent never answers setup, and returns it once setup was sent.
func (e *testEnv) startHeldAtSetup(restored bool) *fakeGuest {
	e.t.Helper()
	e.backend.setNext(true, restored)
	e.mustCall("startVM", map[string]any{"bundlePath": "/nonexistent"}, nil)
	g := e.backend.last()
	waitFor(e.t, "setup sent", func() bool {
		g.agent.mu.Lock()
		defer g.agent.mu.Unlock()
		return g.agent.setup != nil
	})
	return g
}

// TestGuestDeathDuringSetup: a guest that ends while the helper waits for
// its agent's setup reply (a kernel panic, whose VM leaves the agent's
// connection open) fails the start at once with the guest's reason, not
// after the call's timeout.
func TestGuestDeathDuringSetup(t *testing.T) {
	e := newTestEnv(t)
	g := e.startHeldAtSetup(false)
	began := time.Now()
	g.endLeavingConn(errCrash)
	ev := e.next(protocol.EventError)
	require.NotNil(t, ev.Fatal)
	assert.True(t, *ev.Fatal)
	assert.Contains(t, ev.Message, errCrash.Error())
	assert.Less(t, time.Since(began), agentCallTimeout/2, "the start failed only when the setup call timed out")
	waitFor(t, "isRunning false", func() bool {
		var r protocol.IsRunningResult
		e.mustCall("isRunning", nil, &r)
		return !r.Running
	})
	assert.True(t, g.stopped)
	assert.Len(t, e.backend.started(), 1, "a guest that was not restored from a snapshot was booted again")
	assert.Zero(t, g.discards())
}

// TestRestoredGuestDeathBootsCold: a guest restored from a snapshot that
// ends before its agent is set up (the first restore's kernel panic seen
// in the nested harness) costs a cold boot, not the start: the snapshot is
// discarded, the guest boots again and connects, and the client sees no
// error.
func TestRestoredGuestDeathBootsCold(t *testing.T) {
	e := newTestEnv(t)
	warm := e.startHeldAtSetup(true)
	e.backend.setNext(false, false)
	warm.endLeavingConn(errCrash)
	for {
		ev := e.next(protocol.EventError, protocol.EventStartupStep)
		require.NotEqual(t, protocol.EventError, ev.Type, "the client saw an error: %s", ev.Message)
		if ev.Step == StepGuestSetup && ev.Status == protocol.StepCompleted {
			break
		}
	}
	// The step's completion comes just before the guest counts as
	// connected (connect sets it last).
	waitFor(t, "isGuestConnected true", func() bool {
		var r protocol.IsGuestConnectedResult
		e.mustCall("isGuestConnected", nil, &r)
		return r.Connected
	})
	guests := e.backend.started()
	require.Len(t, guests, 2)
	assert.Equal(t, 1, warm.discards(), "the snapshot of the guest that died was kept")
	warm.mu.Lock()
	assert.True(t, warm.stopped, "the dead guest was not stopped")
	warm.mu.Unlock()
	assert.False(t, guests[1].restored)
	e.spawn(map[string]any{"id": "p1", "name": "s1", "command": "/bin/true"})
	_, ok := guests[1].agent.spawned("p1")
	assert.True(t, ok, "the guest booted cold did not get the spawn")
}

func TestUnansweredPingsDisconnect(t *testing.T) {
	backend := &fakeBackend{t: t}
	s, err := New(Options{
		Backend: "fake", Backends: map[string]BackendFactory{"fake": func() (Backend, error) { return backend, nil }},
		DataDir: t.TempDir(), SystemDirs: []string{}, PingInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	defer s.Close(context.Background())
	_, err = s.Call(context.Background(), "startVM", nil)
	require.NoError(t, err)
	svc, err := s.Profile("", "") // no configure: the default profile
	require.NoError(t, err)
	waitFor(t, "connected", func() bool { r, _ := svc.isGuestConnected(context.Background(), struct{}{}); return r.Connected })
	g := backend.last()
	g.agent.mu.Lock()
	g.agent.ignorePing = true
	g.agent.mu.Unlock()
	waitFor(t, "guest declared dead", func() bool { r, _ := svc.isRunning(context.Background(), struct{}{}); return !r.Running })
	r, _ := svc.isGuestConnected(context.Background(), struct{}{})
	assert.False(t, r.Connected)
}

func TestSplitUTF8(t *testing.T) {
	s := strings.Repeat("é", 10) // 2 bytes each
	parts := splitUTF8(s, 5)
	assert.Equal(t, s, strings.Join(parts, ""))
	for _, p := range parts {
		assert.LessOrEqual(t, len(p), 5)
		assert.True(t, strings.HasPrefix(p, "é") || p == "")
	}
	assert.Equal(t, []string{"abc"}, splitUTF8("abc", 5))
}

func TestStartVMWhileTheOldGuestIsStopping(t *testing.T) {
	e := newTestEnv(t)
	e.start()
	stopped := make(chan error, 1)
	go func() { stopped <- e.call("stopVM", nil, nil) }()
	waitFor(t, "stop begun", func() bool {
		e.s.mu.Lock()
		defer e.s.mu.Unlock()
		return e.s.guest == nil || e.s.guest.stopping.Load()
	})
	e.start() // waits for the old guest if needed, then boots a new one
	require.NoError(t, <-stopped)
	var running protocol.IsRunningResult
	e.mustCall("isRunning", nil, &running)
	assert.True(t, running.Running)
	assert.Len(t, e.backend.guests, 2)
}

func TestParamsAcceptJavaScriptNumbers(t *testing.T) {
	e := newTestEnv(t)
	e.mustCall("configure", json.RawMessage(`{"userDataName":"p","userDataRoot":"/r","memoryMB":3072.0,"cpuCount":4e0}`), nil)
	g := e.start()
	assert.Equal(t, 3072, g.cfg.MemoryMiB)
	assert.Equal(t, 4, g.cfg.CPUCount)
	var r protocol.PruneResult
	e.mustCall("pruneSessionCaches", json.RawMessage(`{"onlyIfFreeBytesBelow":1e3,"includeSessionTmp":false,"sessionTmpOlderThanSeconds":86400.0}`), &r)
	assert.Empty(t, r.PrunedSessions)
}
