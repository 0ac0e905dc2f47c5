package helper

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One ping answered too late (past its timeout) is a slow guest, not a dead
// one: isGuestConnected stays true throughout, and the guest keeps running.
func TestOneSlowPingKeepsTheGuestConnected(t *testing.T) {
	const interval = 10 * time.Millisecond
	e := newTestEnvWith(t, func(o *Options) { o.PingInterval = interval })
	g := e.start()
	g.agent.mu.Lock()
	g.agent.delayPing = 3 * pingTimeoutIntervals * interval // well past the ping's timeout
	start := g.agent.pings
	g.agent.mu.Unlock()

	var flipped atomic.Bool
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if r, _ := e.s.isGuestConnected(context.Background(), struct{}{}); !r.Connected {
				flipped.Store(true)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	// The delayed ping, then several answered ones after it.
	waitFor(t, "pings after the slow one", func() bool {
		g.agent.mu.Lock()
		defer g.agent.mu.Unlock()
		return g.agent.delayPing == 0 && g.agent.pings >= start+5
	})
	close(stop)
	<-watched
	assert.False(t, flipped.Load(), "isGuestConnected went false over one slow ping")
	var running struct{ Running bool }
	e.mustCall("isRunning", nil, &running)
	assert.True(t, running.Running)
	assert.Len(t, e.backend.guests, 1, "the guest was not restarted")
}

// Pings unanswered pingFailuresFatal times in a row declare the guest dead,
// whatever came before.
func TestUnansweredPingsAfterASlowOne(t *testing.T) {
	const interval = 10 * time.Millisecond
	e := newTestEnvWith(t, func(o *Options) { o.PingInterval = interval })
	g := e.start()
	g.agent.mu.Lock()
	g.agent.delayPing = 2 * pingTimeoutIntervals * interval
	g.agent.mu.Unlock()
	waitFor(t, "the slow ping answered", func() bool {
		g.agent.mu.Lock()
		defer g.agent.mu.Unlock()
		return g.agent.delayPing == 0
	})
	g.agent.mu.Lock()
	g.agent.ignorePing = true
	g.agent.mu.Unlock()
	waitFor(t, "guest declared dead", func() bool {
		r, err := e.s.isRunning(context.Background(), struct{}{})
		require.NoError(t, err)
		return !r.Running
	})
	r, _ := e.s.isGuestConnected(context.Background(), struct{}{})
	assert.False(t, r.Connected)
}
