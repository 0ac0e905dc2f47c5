package helper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// mountLog is a mountGuest that records what sessionMounts asks of it, one
// line a call: "share <host>", "unshare <host>", "mount <target>",
// "unmount <target>".
type mountLog struct {
	mu       sync.Mutex
	calls    []string
	runs     map[string]bool // sessions with a running process
	mountErr map[string]error
	// sharedFor is the session each host path was last shared for.
	sharedFor map[string]string
	// unmountGate, when set, is waited on by each unmount.
	unmountGate chan struct{}
	ended       chan struct{}
}

func newMountLog() *mountLog {
	return &mountLog{runs: map[string]bool{}, mountErr: map[string]error{}, sharedFor: map[string]string{}, ended: make(chan struct{})}
}

func (g *mountLog) note(format string, args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, fmt.Sprintf(format, args...))
}

// take returns the calls since the last take.
func (g *mountLog) take() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := g.calls
	g.calls = nil
	return out
}

func (g *mountLog) share(host string, readOnly bool, session string) (protocol.MountSource, error) {
	g.note("share %s", host)
	g.mu.Lock()
	g.sharedFor[host] = session
	g.mu.Unlock()
	return bind(host), nil
}

func (g *mountLog) shareImmutable(host string) (protocol.MountSource, error) {
	g.note("share immutable %s", host)
	return bind(host), nil
}

func (g *mountLog) unshare(src protocol.MountSource) { g.note("unshare %s", src.Path) }

func (g *mountLog) mountInGuest(m protocol.Mount) error {
	g.note("mount %s", m.Target)
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mountErr[m.Target]
}

func (g *mountLog) unmountInGuest(target string) error {
	if g.unmountGate != nil {
		<-g.unmountGate
	}
	g.note("unmount %s", target)
	return nil
}

func (g *mountLog) sessionRuns(session string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.runs[session]
}

func (g *mountLog) mounted(string)           {}
func (g *mountLog) vmEnded() <-chan struct{} { return g.ended }
func (g *mountLog) logger() *slog.Logger     { return slog.New(slog.DiscardHandler) }

// states lists every recorded target as "mounted" or "withdrawn".
func (m *sessionMounts) states() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]string{}
	for t, r := range m.byTarget {
		out[t] = map[bool]string{false: "mounted", true: "withdrawn"}[r.withdrawn]
	}
	return out
}

// mountsFixture is a sessionMounts on a mountLog with session s's home
// and its mnt/work mounted.
func mountsFixture(t *testing.T) (*sessionMounts, *mountLog, string, string) {
	g := newMountLog()
	m := &sessionMounts{guest: g}
	home, work := t.TempDir(), t.TempDir()
	require.NoError(t, m.mount(home, "/sessions/s", false))
	require.NoError(t, m.mount(work, "/sessions/s/mnt/work", false))
	assert.Equal(t, []string{"share " + home, "mount /sessions/s", "share " + work, "mount /sessions/s/mnt/work"}, g.take())
	return m, g, home, work
}

// TestSessionMountsShareForTheirSession: a mount in a session's home, or
// below it, is shared for that session (its files shown as the session
// uid's); one outside every session for none.
func TestSessionMountsShareForTheirSession(t *testing.T) {
	_, g, home, work := mountsFixture(t)
	m := &sessionMounts{guest: g}
	sdk := t.TempDir()
	require.NoError(t, m.mount(sdk, "/opt/sdk", true))
	g.mu.Lock()
	defer g.mu.Unlock()
	assert.Equal(t, map[string]string{home: "s", work: "s", sdk: ""}, g.sharedFor)
}

// mounted → withdrawn → mounted → forgotten, each transition once.
func TestSessionMountsStateMachine(t *testing.T) {
	m, g, home, work := mountsFixture(t)
	require.NoError(t, m.mount(work, "/sessions/s/mnt/work", false))
	assert.Empty(t, g.take(), "the same mount again is nothing")

	m.idle("s")
	assert.ElementsMatch(t, []string{"unshare " + work, "unshare " + home}, g.take(), "withdrawn, not unmounted")
	assert.Equal(t, map[string]string{"/sessions/s": "withdrawn", "/sessions/s/mnt/work": "withdrawn"}, m.states())
	m.idle("s")
	assert.Empty(t, g.take(), "a withdrawn target is not unshared twice")
	assert.True(t, m.has("s"), "withdrawn records stay")

	done, err := m.prepareRead("s", "/sessions/s/mnt/work/f")
	require.NoError(t, err)
	assert.Equal(t, []string{"share " + home, "mount /sessions/s", "share " + work, "mount /sessions/s/mnt/work"}, g.take(), "outer first")
	assert.Equal(t, map[string]string{"/sessions/s": "mounted", "/sessions/s/mnt/work": "mounted"}, m.states())
	done()
	assert.ElementsMatch(t, []string{"unshare " + work, "unshare " + home}, g.take(), "the read's end withdraws them again")

	m.forget("s")
	assert.Empty(t, g.take(), "forgetting withdrawn targets unshares nothing")
	assert.Empty(t, m.states())
	assert.False(t, m.has("s"))
}

// A readFile remounts only the targets that lead to its path.
func TestSessionMountsRemountForReadPicksThePath(t *testing.T) {
	m, g, home, _ := mountsFixture(t)
	m.idle("s")
	g.take()
	done, err := m.prepareRead("s", "/sessions/s/notes.txt")
	require.NoError(t, err)
	assert.Equal(t, []string{"share " + home, "mount /sessions/s"}, g.take())
	assert.Equal(t, "withdrawn", m.states()["/sessions/s/mnt/work"])
	done()
}

// Forgetting mounted targets unshares them, whatever runs in the session.
func TestSessionMountsForgetMounted(t *testing.T) {
	m, g, home, work := mountsFixture(t)
	g.runs["s"] = true
	m.forget("s")
	assert.Equal(t, []string{"unshare " + work, "unshare " + home}, g.take(), "inner first, no unmount")
	assert.Empty(t, m.states())
}

// A mount of something else at a target replaces what was there, which
// is unshared even when the agent fails to mount the new one.
func TestSessionMountsReplace(t *testing.T) {
	m, g, _, work := mountsFixture(t)
	require.NoError(t, m.mount(work, "/sessions/s/mnt/work", true))
	assert.Equal(t, []string{"share " + work, "mount /sessions/s/mnt/work", "unshare " + work}, g.take())
	assert.Equal(t, "mounted", m.states()["/sessions/s/mnt/work"])

	other := t.TempDir()
	g.mountErr["/sessions/s/mnt/work"] = errors.New("agent says no")
	require.ErrorContains(t, m.mount(other, "/sessions/s/mnt/work", false), "agent says no")
	assert.Equal(t, []string{"share " + other, "mount /sessions/s/mnt/work", "unshare " + work, "unshare " + other}, g.take())
	_, had := m.states()["/sessions/s/mnt/work"]
	assert.False(t, had, "neither the old nor the new stays")
}

// Uses and running processes keep idle from withdrawing; a use's end is
// idempotent.
func TestSessionMountsUses(t *testing.T) {
	m, g, _, _ := mountsFixture(t)
	first, second := m.use("s"), m.use("s")
	first()
	first() // ending it again must not end the second use
	assert.Empty(t, g.take(), "the second use holds the mounts")
	assert.Equal(t, "mounted", m.states()["/sessions/s"])

	g.runs["s"] = true
	second()
	assert.Empty(t, g.take(), "a running process holds them")
	g.runs["s"] = false
	m.idle("s")
	assert.Len(t, g.take(), 2, "now idle: both withdrawn")
	m.mu.Lock()
	assert.Empty(t, m.uses, "no use left behind")
	m.mu.Unlock()
}

// A fresh start unmounts and withdraws the spawn mounts it did not ask
// for, and only when its own use is the session's only one.
func TestSessionMountsRetire(t *testing.T) {
	m, g, _, work := mountsFixture(t)
	data, cfg := t.TempDir(), t.TempDir()
	require.NoError(t, m.mount(data, "/sessions/s/data", false)) // the run subcommand's --mount
	require.NoError(t, m.mount(cfg, "/sessions/s/.gitconfig", true))
	g.take()

	own, other := m.use("s"), m.use("s")
	m.retire("s", map[string]bool{"/sessions/s": true})
	assert.Empty(t, g.take(), "another call uses the session")
	other()
	g.take()
	m.retire("s", map[string]bool{"/sessions/s": true})
	assert.ElementsMatch(t, []string{"unmount /sessions/s/mnt/work", "unshare " + work, "unmount /sessions/s/.gitconfig", "unshare " + cfg}, g.take())
	assert.Equal(t, map[string]string{
		"/sessions/s": "mounted", "/sessions/s/data": "mounted",
		"/sessions/s/mnt/work": "withdrawn", "/sessions/s/.gitconfig": "withdrawn",
	}, m.states())
	m.retire("s", map[string]bool{"/sessions/s": true})
	assert.ElementsMatch(t, []string{"unmount /sessions/s/mnt/work", "unmount /sessions/s/.gitconfig"}, g.take(), "unmounted again, not unshared twice")
	own()
}

// A oneShot process's end releases the session (unmounted, forgotten,
// inner first), and a spawn of the session waits for that.
func TestSessionMountsOneShotRelease(t *testing.T) {
	m, g, home, work := mountsFixture(t)
	g.unmountGate = make(chan struct{})
	p := &process{id: "once", session: "s"}
	m.addOneShot(p)
	m.exited(p)

	waited := make(chan error, 1)
	go func() { waited <- m.waitRelease(context.Background(), "s") }()
	select {
	case <-waited:
		t.Fatal("a spawn went ahead while the release was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	close(g.unmountGate)
	require.NoError(t, <-waited)
	// The exit's idle withdraw may come first: each is unshared once
	// either way, and unmounted inner first.
	calls := g.take()
	assert.ElementsMatch(t, []string{"unmount /sessions/s/mnt/work", "unshare " + work, "unmount /sessions/s", "unshare " + home}, calls)
	assert.Less(t, slices.Index(calls, "unmount /sessions/s/mnt/work"), slices.Index(calls, "unmount /sessions/s"))
	assert.Empty(t, m.states(), "forgotten")
	assert.False(t, m.takeOneShot(p), "the oneShot record went with the exit")

	q := &process{id: "plain", session: "s"}
	m.exited(q)
	require.NoError(t, m.waitRelease(context.Background(), "s"), "a plain exit starts no release")
}

// A oneShot end leaves the mounts alone while the session is in use.
func TestSessionMountsReleaseWaitsForIdle(t *testing.T) {
	m, g, _, _ := mountsFixture(t)
	done := m.use("s")
	m.release("s")
	assert.Empty(t, g.take())
	done()
	g.take()
	m.release("s")
	assert.Len(t, g.take(), 2, "the withdrawn targets unmounted, nothing unshared twice")
	assert.Empty(t, m.states())
}

// prepare mounts the home, then each entry (one that fails is reported),
// and retires or restores as the spawn's flags say.
func TestSessionMountsPrepare(t *testing.T) {
	m, g, home, _ := mountsFixture(t)
	m.idle("s")
	g.take()
	skills := t.TempDir()
	g.mountErr["/sessions/s/.claude/skills"] = errors.New("agent says no")
	asked := spawnMounts{session: "s", home: home, resume: true, entries: []spawnMount{
		{name: ".claude/skills", host: skills, readOnly: true, targets: []string{"/sessions/s/mnt/.claude/skills", "/sessions/s/.claude/skills"}},
		{name: "bad", err: errors.New("no such mode")},
		{name: "gone", host: filepath.Join(home, "missing"), targets: []string{"/sessions/s/mnt/gone"}},
	}}
	lease, err := m.prepare(context.Background(), asked)
	require.NoError(t, err)
	assert.Equal(t, []string{".claude/skills", "bad", "gone"}, lease.failed)
	assert.Equal(t, map[string]string{
		"/sessions/s": "mounted", "/sessions/s/mnt/.claude/skills": "mounted",
		"/sessions/s/mnt/work": "mounted", // a resume brings it back
	}, m.states())
	lease.done()
	g.take()

	asked.resume = false
	asked.entries = nil
	lease, err = m.prepare(context.Background(), asked)
	require.NoError(t, err)
	assert.Contains(t, g.take(), "unmount /sessions/s/mnt/work", "a fresh start retires what it did not ask for")
	lease.done()

	_, err = m.prepare(context.Background(), spawnMounts{session: "s", home: filepath.Join(home, "missing")})
	require.Error(t, err, "the home's failure fails the spawn")
	m.mu.Lock()
	assert.Empty(t, m.uses, "and ends its use")
	m.mu.Unlock()
	assert.NoError(t, os.RemoveAll(home))
}
