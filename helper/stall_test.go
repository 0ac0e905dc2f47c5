package helper

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// A guest that stops reading its agent connection is stopped all the same:
// the shutdown request's write gives up after shutdownSendTimeout, and the
// backend stops the guest; its egress goes with it.
func TestStopVMStopsAGuestThatStoppedReading(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	g.agent.stopReading()
	t.Cleanup(g.agent.resumeReading) // before the env's Close, should this test fail

	ctx, cancel := context.WithTimeout(e.ctx, 15*time.Second) // the client's bound
	defer cancel()
	began := time.Now()
	_, err := e.h.Call(ctx, protocol.MethodStopVM, nil)
	took := time.Since(began)
	t.Logf("stopVM against a guest that stopped reading took %v", took.Round(time.Millisecond))
	require.NoError(t, err)
	assert.Less(t, took, shutdownSendTimeout+2*time.Second)

	g.mu.Lock()
	stopped := g.stopped
	g.mu.Unlock()
	assert.True(t, stopped, "the backend stopped the guest")
	var running protocol.IsRunningResult
	e.mustCall("isRunning", nil, &running)
	assert.False(t, running.Running)
	select {
	case <-g.egress.(*idleListener).closed:
	default:
		t.Error("the guest's egress listener is still open")
	}
}

// A ping whose write stalls fails like an unanswered one: pingFailuresFatal
// of them declare the guest dead, and it is torn down.
func TestPingsWhoseWriteStallsDeclareTheGuestDead(t *testing.T) {
	const interval = 10 * time.Millisecond
	e := newTestEnvWith(t, func(o *Options) { o.PingInterval = interval })
	g := e.start()
	g.agent.stopReading()
	t.Cleanup(g.agent.resumeReading)

	began := time.Now()
	waitFor(t, "the guest declared dead", func() bool {
		r, err := e.s.isRunning(context.Background(), struct{}{})
		require.NoError(t, err)
		return !r.Running
	})
	t.Logf("a guest that stopped reading was declared dead and torn down after %v", time.Since(began).Round(time.Millisecond))
	ev := e.next(protocol.EventError)
	assert.Contains(t, ev.Message, "the guest ended unexpectedly")
	g.mu.Lock()
	assert.True(t, g.stopped, "the backend stopped the guest")
	g.mu.Unlock()
}

// A guest's teardown drops its waiting guest requests and stops their
// timers; the client's late answer to one finds nothing waiting.
func TestGuestTeardownDropsItsGuestRequests(t *testing.T) {
	for name, end := range map[string]func(*testEnv, *fakeGuest){
		"stopVM": func(e *testEnv, _ *fakeGuest) { e.mustCall("stopVM", nil, nil) },
		"died":   func(_ *testEnv, g *fakeGuest) { g.die(errCrash) },
	} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t)
			g := e.start()
			e.spawn(map[string]any{"id": "p1", "name": "s", "command": "sh"})
			g.agent.request("p1", protocol.GuestRequest{ID: 7, Method: "askUser", TimeoutMillis: int64(protocol.MaxGuestRequestTimeout / time.Millisecond)})
			ev := e.next(protocol.EventRequest)
			guestRequests.mu.Lock()
			r := guestRequests.byID[ev.ID]
			guestRequests.mu.Unlock()
			require.NotNil(t, r)

			end(e, g)
			waitFor(t, "the guest torn down", func() bool {
				r, err := e.s.isRunning(context.Background(), struct{}{})
				require.NoError(t, err)
				return !r.Running
			})
			assert.Zero(t, guestRequests.waiting(e.s), "requests waiting after their guest ended")
			assert.False(t, r.timer.Stop(), "the request's timer was still running")
			err := e.call("sendGuestResponse", map[string]any{"id": ev.ID, "resultJson": json.RawMessage(`"{}"`)}, nil)
			assert.ErrorContains(t, err, "no guest request")
		})
	}
}
