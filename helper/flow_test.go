package helper

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// TestGuestRequestFloodStaysWithinTheCap: guest requests of 1 MiB params
// from two sessions (64 MiB asked) while the client reads nothing: what the
// hub holds for the client stays within its cap, and the excess is refused
// to the guest.
func TestGuestRequestFloodStaysWithinTheCap(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "a", "name": "s1", "command": "sh"})
	e.spawn(map[string]any{"id": "b", "name": "s2", "command": "sh"})
	big := json.RawMessage(`"` + strings.Repeat("x", protocol.MaxGuestRequestParamsBytes-2) + `"`)
	const perSession = protocol.MaxGuestRequestsPerSession
	for i := range 2 * perSession {
		g.agent.request([]string{"a", "b"}[i%2], protocol.GuestRequest{ID: uint64(1 + i), Method: "m", Params: big})
	}
	refused := 0
	waitFor(t, "every request published or refused", func() bool {
		refused = 0
		for i := range 2 * perSession {
			if r, ok := g.agent.answer(uint64(1 + i)); ok {
				refused++
				assert.Contains(t, r.Error, "not reading its events")
			}
		}
		return refused+guestRequests.waiting(e.s) == 2*perSession
	})
	held := 0
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		ev, err := e.sub.Next(ctx)
		if err != nil {
			break
		}
		if ev.Type == protocol.EventRequest {
			raw, _ := json.Marshal(ev.Params)
			held += len(raw)
		}
	}
	t.Logf("request params held for the client: %.1f MiB; %d of %d requests refused", float64(held)/(1<<20), refused, 2*perSession)
	assert.LessOrEqual(t, held, MaxBacklogBytes, "the hub holds no more than its cap")
	assert.Positive(t, refused)
}

// TestGuestRequestRateLimit: a session gets a burst, then its rate; the
// excess is refused to the guest with the reason.
func TestGuestRequestRateLimit(t *testing.T) {
	table := &guestRequestTable{byID: map[string]*guestRequest{}, buckets: map[sessionKey]*tokenBucket{}}
	key := sessionKey{nil, "s"}
	now := time.Now()
	allowed := 0
	for range 10 * guestRequestBurst {
		if table.allow(key, now) {
			allowed++
		}
	}
	assert.Equal(t, guestRequestBurst, allowed, "a burst, then nothing at once")
	assert.True(t, table.allow(key, now.Add(time.Second/guestRequestRate)), "one more per 1/rate")
	assert.False(t, table.allow(key, now.Add(time.Second/guestRequestRate)))
	assert.True(t, table.allow(sessionKey{nil, "other"}, now), "per session")

	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "p", "name": "flood", "command": "sh"})
	guestRequests.mu.Lock()
	guestRequests.buckets[sessionKey{e.s, "flood"}] = &tokenBucket{at: time.Now()}
	guestRequests.mu.Unlock()
	g.agent.request("p", protocol.GuestRequest{ID: 1, Method: "m"})
	assert.Contains(t, waitAnswer(t, g, 1).Error, "faster than")
}

// outputLine is process i's k-th line: checkable for order and loss.
func outputLine(i, k int) string {
	return fmt.Sprintf("p%02d line %07d %s\n", i, k, strings.Repeat("x", 40))
}

// runOutputFlood makes 32 processes print perProcess bytes each (lines,
// in events of chunk bytes, within their credit) and exit, while read consumes the
// events; it checks every byte and every exit arrived, in order.
func runOutputFlood(t *testing.T, perProcess, chunk int, read func(e *testEnv, got func(protocol.Event) bool)) {
	e := newTestEnv(t)
	e.sub.Close() // read's subscriptions are the only ones: they get every event
	g := e.start()
	const procs = 32
	want := make([]string, procs)
	for i := range procs {
		id := fmt.Sprintf("p%02d", i)
		e.spawn(map[string]any{"id": id, "name": "s" + id, "command": "sh"})
		var b strings.Builder
		for k := 0; b.Len() < perProcess; k++ {
			b.WriteString(outputLine(i, k))
		}
		want[i] = b.String()
	}
	for i := range procs {
		id := fmt.Sprintf("p%02d", i)
		go func() {
			g.agent.emitOutput(id, want[i], chunk)
			g.agent.exit(id, 0)
		}()
	}
	got := make(map[string]*strings.Builder, procs)
	exits := 0
	start := time.Now()
	read(e, func(ev protocol.Event) bool {
		switch ev.Type {
		case protocol.EventStdout:
			if got[ev.ID] == nil {
				got[ev.ID] = &strings.Builder{}
			}
			got[ev.ID].WriteString(ev.Data)
		case protocol.EventExit:
			exits++
		}
		return exits < procs
	})
	took := time.Since(start)
	total := 0
	for i := range procs {
		b := got[fmt.Sprintf("p%02d", i)]
		require.NotNil(t, b, "process %d's output", i)
		total += b.Len()
		assert.True(t, b.String() == want[i], "process %d: %d of %d bytes arrived, in order: %v", i, b.Len(), len(want[i]), b.Len() == len(want[i]))
	}
	t.Logf("delivered %d of %d bytes and %d of %d exits in %v", total, procs*perProcess, exits, procs, took.Round(time.Millisecond))
	assert.Equal(t, procs, exits)
}

// readAdapter reads events as the socket server does (Service.Subscribe
// and Delivered), pausing pause after each; every vanishEvery events it
// takes one more and drops it unwritten (the connection is gone), stays
// away for away, and subscribes again. It checks the hub stays within its
// cap throughout.
func readAdapter(pause time.Duration, vanishEvery int, away time.Duration) func(e *testEnv, got func(protocol.Event) bool) {
	return func(e *testEnv, got func(protocol.Event) bool) {
		subscribe := func() *protocol.Subscription {
			sub, err := e.s.Subscribe(context.Background())
			require.NoError(e.t, err)
			return sub
		}
		sub := subscribe()
		defer func() { sub.Cancel() }()
		maxHeld := 0
		for n := 1; ; n++ {
			var ev protocol.Event
			select {
			case ev = <-sub.Events:
			case <-time.After(30 * time.Second):
				e.t.Fatal("events stopped coming")
			}
			if vanishEvery > 0 && n%vanishEvery == 0 {
				sub.Cancel() // ev was not written
				time.Sleep(away)
				sub = subscribe()
				continue
			}
			delivered(sub)
			all, _ := e.s.hub.heldBytes()
			maxHeld = max(maxHeld, all)
			if !got(ev) {
				break
			}
			if pause > 0 {
				time.Sleep(pause)
			}
		}
		e.t.Logf("the hub held at most %.1f MiB", float64(maxHeld)/(1<<20))
		assert.LessOrEqual(e.t, maxHeld, MaxBacklogBytes)
	}
}

// TestSlowSubscriberGetsEveryByteAndExit: 32 processes print 1 MiB each
// in 16 KiB events (2048 of them, twice the backlog's count) while the
// subscriber takes a pause after every event: the producers are
// held back, nothing is dropped, every exit arrives.
func TestSlowSubscriberGetsEveryByteAndExit(t *testing.T) {
	runOutputFlood(t, 1<<20, 16<<10, readAdapter(2*time.Millisecond, 0, 0))
}

// TestVanishingSubscriberGetsEveryByteAndExit: the subscriber goes away
// repeatedly, for longer than the producers need to fill any backlog, and
// each time loses the write of the event it held: the next subscription
// gets everything, in order.
func TestVanishingSubscriberGetsEveryByteAndExit(t *testing.T) {
	runOutputFlood(t, 1<<20, 16<<10, readAdapter(0, 200, 200*time.Millisecond))
}

// TestOutputThroughputFastSubscriber logs what a subscriber that keeps up
// receives per second (32 processes × 4 MiB through the fake agent, within
// their credit, and the hub). A figure, not a check: it runs only with
// COWORK_VMM_THROUGHPUT=1.
func TestOutputThroughputFastSubscriber(t *testing.T) {
	if os.Getenv("COWORK_VMM_THROUGHPUT") != "1" {
		t.Skip("a throughput figure: set COWORK_VMM_THROUGHPUT=1")
	}
	start := time.Now()
	runOutputFlood(t, 4<<20, 64<<10, readAdapter(0, 0, 0))
	t.Logf("fast subscriber: %.0f MB/s", float64(32*4<<20)/1e6/time.Since(start).Seconds())
}

// TestOutputPastTheWindowIsDropped: an agent that ignores its credit
// (hostile) gets no more than its window and one event held for the
// client; its exit still arrives.
func TestOutputPastTheWindowIsDropped(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "h", "name": "s", "command": "sh"})
	chunk := strings.Repeat("y", protocol.MaxOutputChunkBytes)
	for range 32 { // 2 MiB, nobody reading, no credit given
		g.agent.emit(protocol.Event{Type: protocol.EventStdout, ID: "h", Data: chunk})
	}
	g.agent.exit("h", 0)
	waitFor(t, "the exit, before anything is read", func() bool {
		e.s.mu.Lock()
		defer e.s.mu.Unlock()
		p := e.s.procs.get("h")
		return p != nil && !p.running
	})
	held := 0
	for {
		ev := e.next(protocol.EventStdout, protocol.EventExit)
		if ev.Type == protocol.EventExit {
			break
		}
		held += len(ev.Data)
	}
	t.Logf("held for the client: %d of %d bytes", held, 32*len(chunk))
	assert.LessOrEqual(t, held, outputWindow+protocol.MaxOutputChunkBytes)
	assert.GreaterOrEqual(t, held, outputWindow-protocol.MaxOutputChunkBytes)
}

// TestRunningProcessesAreBounded: the output memory bound (maxOutputHeld)
// rests on a profile running at most maxRunningProcesses; the next spawn
// is refused, and one is taken again once a process has exited.
func TestRunningProcessesAreBounded(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	for i := range maxRunningProcesses {
		e.spawn(map[string]any{"id": fmt.Sprintf("p%02d", i), "name": "s", "command": "sh"})
	}
	err := e.call("spawn", map[string]any{"id": "over", "name": "s", "command": "sh"}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the most a profile may run")

	g.agent.exit("p00", 0)
	waitFor(t, "p00's exit", func() bool {
		e.s.mu.Lock()
		defer e.s.mu.Unlock()
		return !e.s.procs.get("p00").running
	})
	e.spawn(map[string]any{"id": "over", "name": "s", "command": "sh"})
}
