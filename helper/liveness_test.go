package helper

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// fakeProgress is what progressGuests report: a count that moves at each
// question while moving is set (vCPUs running), frozen otherwise.
type fakeProgress struct {
	moving atomic.Bool
	count  atomic.Uint64
}

// progressBackend starts its backend's guests as progressGuests.
type progressBackend struct {
	Backend
	progress *fakeProgress
}

func (b progressBackend) Start(ctx context.Context, cfg GuestConfig) (Guest, error) {
	g, err := b.Backend.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return progressGuest{g, b.progress}, nil
}

// progressGuest is a guest that implements ProgressReporter, as the vm
// backend's do.
type progressGuest struct {
	Guest
	progress *fakeProgress
}

func (g progressGuest) Progress() (uint64, bool) {
	if g.progress.moving.Load() {
		return g.progress.count.Add(1), true
	}
	return g.progress.count.Load(), true
}

const livenessPingInterval = 20 * time.Millisecond

// livenessEnv starts a guest whose agent ignores pings; progress non-nil
// makes it a ProgressReporter.
func livenessEnv(t *testing.T, progress *fakeProgress) (*testEnv, *fakeGuest) {
	e := newTestEnvWith(t, func(o *Options) {
		o.PingInterval = livenessPingInterval
		if progress != nil {
			factory := o.Backends["fake"]
			o.Backends["fake"] = func() (Backend, error) {
				b, err := factory()
				return progressBackend{b, progress}, err
			}
		}
	})
	g := e.start()
	g.agent.mu.Lock()
	g.agent.ignorePing = true
	g.agent.mu.Unlock()
	return e, g
}

// talk has the agent send an event every millisecond until stop is closed,
// as a busy session's output does.
func talk(g *fakeGuest, stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			g.agent.emit(protocol.Event{Type: protocol.EventStdout, ID: "busy", Data: "."})
		}
	}()
	return done
}

func ignoredPings(g *fakeGuest) int {
	g.agent.mu.Lock()
	defer g.agent.mu.Unlock()
	return g.agent.ignoredPings
}

func guestRunning(t *testing.T, e *testEnv) bool {
	r, err := e.s.isRunning(context.Background(), struct{}{})
	require.NoError(t, err)
	return r.Running
}

// A guest whose pings go unanswered but whose agent still talks (and whose
// vCPUs run, where it can tell) is busy: it stays up and connected over
// many more unanswered pings than would declare a silent one dead. Once
// its agent falls silent too, it is declared dead.
func TestBusyGuestIsNotDeclaredDead(t *testing.T) {
	for name, progress := range map[string]*fakeProgress{"vCPUs running": {}, "no progress reported": nil} {
		t.Run(name, func(t *testing.T) {
			if progress != nil {
				progress.moving.Store(true)
			}
			e, g := livenessEnv(t, progress)
			stop := make(chan struct{})
			talking := talk(g, stop)
			waitFor(t, "unanswered pings", func() bool {
				require.True(t, guestRunning(t, e), "a busy guest was declared dead after %d unanswered pings", ignoredPings(g))
				return ignoredPings(g) >= 3*pingFailuresFatal
			})
			r, _ := e.s.isGuestConnected(context.Background(), struct{}{})
			assert.True(t, r.Connected)
			close(stop)
			<-talking
			start := time.Now()
			waitFor(t, "the silent guest declared dead", func() bool { return !guestRunning(t, e) })
			t.Logf("declared dead %v after its agent fell silent", time.Since(start))
		})
	}
}

// An agent gone silent is dead however busy the guest's vCPUs are (a spawn
// can keep them busy after the agent hung); vCPUs that stopped run no
// agent, whatever frames came before.
func TestSilentAgentOrStoppedVCPUsAreDead(t *testing.T) {
	t.Run("silent agent, vCPUs running", func(t *testing.T) {
		progress := &fakeProgress{}
		progress.moving.Store(true)
		e, g := livenessEnv(t, progress)
		waitFor(t, "the guest declared dead", func() bool { return !guestRunning(t, e) })
		assert.LessOrEqual(t, ignoredPings(g), pingFailuresFatal+1)
	})
	t.Run("talking agent, vCPUs stopped", func(t *testing.T) {
		e, g := livenessEnv(t, &fakeProgress{})
		stop := make(chan struct{})
		talking := talk(g, stop)
		defer func() { close(stop); <-talking }()
		waitFor(t, "the guest declared dead", func() bool { return !guestRunning(t, e) })
		assert.LessOrEqual(t, ignoredPings(g), pingFailuresFatal+1)
	})
}

// A guest that talks and runs but never answers a ping is forgiven only
// pingBusyFatal pings in a row: an agent that answers no request at all is
// of no use, however busy.
func TestBusyGuestThatNeverAnswersIsDeadInTheEnd(t *testing.T) {
	progress := &fakeProgress{}
	progress.moving.Store(true)
	e, g := livenessEnv(t, progress)
	stop := make(chan struct{})
	talking := talk(g, stop)
	defer func() { close(stop); <-talking }()
	waitFor(t, "the guest declared dead", func() bool { return !guestRunning(t, e) })
	ignored := ignoredPings(g)
	assert.GreaterOrEqual(t, ignored, pingBusyFatal+pingFailuresFatal)
	assert.LessOrEqual(t, ignored, pingBusyFatal+pingFailuresFatal+1)
}
