package helper

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Issue #18: one guest, process table, sessions directory and event stream
// served every profile. These tests drive two profiles on one Helper, each
// through a connection of its own, as two Electron profiles of the client
// would.

// profileConn is a connection configured for one profile, with a
// subscription to that profile's events.
type profileConn struct {
	t   *testing.T
	h   *Helper
	ctx context.Context
	s   *Service
	sub *Subscription
}

// connect opens a connection of the env's Helper configured for a profile.
func (e *testEnv) connect(name, root string) *profileConn {
	e.t.Helper()
	c := &profileConn{t: e.t, h: e.h, ctx: protocol.WithConnState(context.Background())}
	c.mustCall("configure", map[string]any{"userDataName": name, "userDataRoot": root, "sessionOnly": true}, nil)
	var err error
	c.s, err = e.h.Profile(name, root)
	require.NoError(e.t, err)
	c.sub = c.s.hub.Subscribe()
	e.t.Cleanup(c.sub.Close)
	return c
}

// conn is the env's own connection as a profileConn.
func (e *testEnv) conn() *profileConn {
	return &profileConn{t: e.t, h: e.h, ctx: e.ctx, s: e.s, sub: e.sub}
}

func (c *profileConn) call(method string, params, result any) error {
	c.t.Helper()
	return callOn(c.t, c.h, c.ctx, method, params, result)
}

func (c *profileConn) mustCall(method string, params, result any) {
	c.t.Helper()
	require.NoError(c.t, c.call(method, params, result), method)
}

// start boots the profile's guest and returns it.
func (c *profileConn) start() *fakeGuest {
	c.t.Helper()
	startOn(c.t, c.h, c.ctx)
	c.s.mu.Lock()
	inst := c.s.guest
	c.s.mu.Unlock()
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return inst.guest.(*fakeGuest)
}

// running says whether isProcessRunning reports id running.
func (c *profileConn) running(id string) bool {
	c.t.Helper()
	var r protocol.IsProcessRunningResult
	c.mustCall("isProcessRunning", map[string]any{"id": id}, &r)
	return r.Running
}

// nextOf returns the next event of the given type.
func (c *profileConn) nextOf(typ string) protocol.Event {
	c.t.Helper()
	for {
		ev, err := c.sub.Next(c.t.Context())
		require.NoError(c.t, err)
		if ev.Type == typ {
			return ev
		}
	}
}

// drained returns every event available now, without waiting.
func (c *profileConn) drained() []protocol.Event {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out []protocol.Event
	for {
		ev, err := c.sub.Next(ctx)
		if err != nil {
			return out
		}
		out = append(out, ev)
	}
}

func TestProfilesAreIsolated(t *testing.T) {
	e := newTestEnv(t)
	a, b := e.conn(), e.connect("other", "/home/u/.config/Claude-2")
	ga, gb := a.start(), b.start()
	require.NotSame(t, ga, gb, "each profile has a guest of its own")

	// The same session name and process id in both.
	for _, c := range []*profileConn{a, b} {
		var r protocol.SpawnResult
		c.mustCall("spawn", map[string]any{"id": "p1", "name": "s", "command": "sh"}, &r)
	}
	ga.agent.emit(protocol.Event{Type: protocol.EventStdout, ID: "p1", Data: "from-A"})
	gb.agent.emit(protocol.Event{Type: protocol.EventStdout, ID: "p1", Data: "from-B"})
	assert.Equal(t, "from-A", a.nextOf(protocol.EventStdout).Data)
	assert.Equal(t, "from-B", b.nextOf(protocol.EventStdout).Data)

	// A's stopVM ends A's processes only.
	a.mustCall("stopVM", nil, nil)
	assert.Equal(t, protocol.Event{Type: "exit", ID: "p1", Signal: "SIGTERM"}, a.nextOf(protocol.EventExit))
	assert.False(t, a.running("p1"))
	assert.True(t, b.running("p1"), "B's process of the same id still runs")
	gb.mu.Lock()
	assert.False(t, gb.stopped, "B's guest was not stopped")
	gb.mu.Unlock()
	var running protocol.IsRunningResult
	b.mustCall("isRunning", nil, &running)
	assert.True(t, running.Running)

	// A's deleteSessionDirs removes A's session "s", not B's.
	aDir, bDir := filepath.Join(a.s.sessionsDir, "s"), filepath.Join(b.s.sessionsDir, "s")
	require.NotEqual(t, aDir, bDir)
	require.DirExists(t, aDir)
	require.DirExists(t, bDir)
	writeFile(t, filepath.Join(bDir, "keep"), 3)
	var del protocol.DeleteResult
	a.mustCall("deleteSessionDirs", map[string]any{"names": []string{"s"}}, &del)
	assert.Equal(t, []string{"s"}, del.Deleted)
	assert.NoDirExists(t, aDir)
	assert.FileExists(t, filepath.Join(bDir, "keep"))
	b.mustCall("deleteSessionDirs", map[string]any{"names": []string{"s"}}, &del)
	assert.Contains(t, del.Errors["s"], "running process", "B's own session is busy")

	// Neither profile saw the other's events.
	for _, ev := range b.drained() {
		assert.NotEqual(t, "from-A", ev.Data, "%+v", ev)
		assert.NotEqual(t, protocol.EventExit, ev.Type, "A's exit reached B: %+v", ev)
	}
	for _, ev := range a.drained() {
		assert.NotEqual(t, "from-B", ev.Data, "%+v", ev)
	}
	var disk protocol.DiskInfoResult
	a.mustCall("getSessionsDiskInfo", map[string]any{"lowWaterBytes": 0}, &disk)
	assert.Empty(t, disk.Sessions, "A's disk info lists A's sessions only")
	b.mustCall("getSessionsDiskInfo", map[string]any{"lowWaterBytes": 0}, &disk)
	require.Len(t, disk.Sessions, 1)
	assert.Equal(t, "s", disk.Sessions[0].Name)
}

// A call on a connection that named no profile acts on the last profile a
// configure named, or on the default profile before any.
func TestCallsWithoutAProfileUseTheLastConfigured(t *testing.T) {
	e := newTestEnv(t)
	oneShot := context.Background() // no ConnState: as a one-shot call
	running := func(ctx context.Context) bool {
		var r protocol.IsRunningResult
		require.NoError(t, callOn(t, e.h, ctx, "isRunning", nil, &r))
		return r.Running
	}
	e.conn().start()
	assert.True(t, running(oneShot), "the env's configure made its profile the last")
	e.connect("other", "/r2")
	assert.False(t, running(oneShot), "now the other profile is the last")
	assert.True(t, running(e.ctx), "a configured connection keeps its own")
	unconfigured := protocol.WithConnState(context.Background()) // a pipe before its configure
	assert.False(t, running(unconfigured))

	fresh := newHelper(t, t.TempDir(), &fakeBackend{t: t})
	require.NoError(t, callOn(t, fresh, oneShot, "startVM", nil, nil))
	def, err := fresh.Profile("", "")
	require.NoError(t, err)
	def.mu.Lock()
	assert.NotNil(t, def.guest, "before any configure, calls act on the default profile")
	def.mu.Unlock()
}

// newHelper is a Helper on dataDir with backend (its guests' host dirs
// none), closed when the test ends.
func newHelper(t *testing.T, dataDir string, backend *fakeBackend, adjust ...func(*Options)) *Helper {
	t.Helper()
	opts := Options{
		Backend:      "fake",
		Backends:     map[string]BackendFactory{"fake": func() (Backend, error) { return backend, nil }},
		DataDir:      dataDir,
		SystemDirs:   []string{},
		StopGrace:    1,
		NetworkCheck: func(context.Context) string { return protocol.NetworkConnected },
		ProbeClient:  answeringProbe{},
	}
	for _, f := range adjust {
		f(&opts)
	}
	h, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

// configured returns a connection of h configured for a profile.
func configured(t *testing.T, h *Helper, name, root string) context.Context {
	t.Helper()
	ctx := protocol.WithConnState(context.Background())
	require.NoError(t, callOn(t, h, ctx, "configure", map[string]any{"userDataName": name, "userDataRoot": root, "sessionOnly": true}, nil))
	return ctx
}

func sessionNamesOf(t *testing.T, h *Helper, ctx context.Context) []string {
	t.Helper()
	var r protocol.DiskInfoResult
	require.NoError(t, callOn(t, h, ctx, "getSessionsDiskInfo", map[string]any{"lowWaterBytes": 0}, &r))
	var names []string
	for _, s := range r.Sessions {
		names = append(names, s.Name)
	}
	return names
}

// The first desktop profile the helper meets keeps <data>/sessions (a data
// directory from before profiles keeps its sessions), recorded so that a
// restart gives it to the same profile whoever comes first; a profile
// without a userDataRoot (the default one, the client subcommand's) never
// takes it; every other profile gets a directory of its own.
func TestSessionsLayout(t *testing.T) {
	data := t.TempDir()
	writeFile(t, filepath.Join(data, "sessions", "old", "f"), 10) // the single-profile layout

	h := newHelper(t, data, &fakeBackend{t: t})
	assert.Empty(t, sessionNamesOf(t, h, context.Background()), "the default profile does not take the old sessions")
	assert.Empty(t, sessionNamesOf(t, h, configured(t, h, "cowork-vmm-client", "")), "nor one without a userDataRoot")
	a := configured(t, h, "A", "/r")
	assert.Equal(t, []string{"old"}, sessionNamesOf(t, h, a), "the first profile does")
	b := configured(t, h, "B", "/r")
	assert.Empty(t, sessionNamesOf(t, h, b))
	sb, err := h.Profile("B", "/r")
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(data, "profiles", profileID(profileKey{"B", "/r"}), "sessions"), sb.sessionsDir)

	stateFile := filepath.Join(data, "profiles", profileID(profileKey{"A", "/r"}), "profile.json")
	fi, err := os.Stat(stateFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	fi, err = os.Stat(filepath.Dir(stateFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	require.NoError(t, h.Close(context.Background()))

	// After a restart, B comes first: A still owns the old sessions.
	h2 := newHelper(t, data, &fakeBackend{t: t})
	assert.Empty(t, sessionNamesOf(t, h2, configured(t, h2, "B", "/r")))
	assert.Equal(t, []string{"old"}, sessionNamesOf(t, h2, configured(t, h2, "A", "/r")))
}

// A profile state that cannot be read might be the owner's: no profile
// takes <data>/sessions then.
func TestUnreadableStateKeepsTheSessionsUnclaimed(t *testing.T) {
	data := t.TempDir()
	writeFile(t, filepath.Join(data, "sessions", "old", "f"), 10)
	bad := filepath.Join(data, "profiles", "someone-0123456789abcdef", "profile.json")
	require.NoError(t, os.MkdirAll(filepath.Dir(bad), 0o700))
	require.NoError(t, os.WriteFile(bad, []byte("{not json"), 0o600))
	h := newHelper(t, data, &fakeBackend{t: t})
	assert.Empty(t, sessionNamesOf(t, h, configured(t, h, "A", "/r")))
}

func TestProfileID(t *testing.T) {
	ids := map[string]profileKey{}
	for _, k := range []profileKey{
		{"Claude", "/home/u/.config"}, {"Claude", "/home/v/.config"}, {"Claude", ""},
		{"", ""}, {"..", "/r"}, {"a/b", "/r"}, {"a_b", "/r"}, {strings.Repeat("x", 300), "/r"},
	} {
		id := profileID(k)
		if other, dup := ids[id]; dup {
			t.Errorf("%+v and %+v share the id %s", k, other, id)
		}
		ids[id] = k
		assert.NoError(t, validateSessionName(id), "%q is one safe name", id)
		assert.False(t, strings.HasPrefix(id, "."), id)
		assert.LessOrEqual(t, len(id), 32+1+16)
	}
	assert.True(t, strings.HasPrefix(profileID(profileKey{"Claude", "/r"}), "Claude-"))
	assert.True(t, strings.HasPrefix(profileID(profileKey{}), "default-"))
}

func TestTooManyProfiles(t *testing.T) {
	h := newHelper(t, t.TempDir(), &fakeBackend{t: t})
	for i := range maxProfiles {
		_, err := h.Profile("p", strings.Repeat("/r", i+1))
		require.NoError(t, err)
	}
	err := callOn(t, h, protocol.WithConnState(context.Background()), "configure", map[string]any{"userDataName": "one-too-many"}, nil)
	require.ErrorContains(t, err, "profiles")
}
