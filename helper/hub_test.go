package helper

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

func ev(i int) protocol.Event {
	return protocol.Event{Type: protocol.EventStdout, ID: "p", Data: strconv.Itoa(i)}
}

// drain returns the events already available to sub (it must not block).
func drain(t *testing.T, sub *Subscription) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Next returns what is there, then ctx.Err()
	var out []string
	for {
		e, err := sub.Next(ctx)
		if err != nil {
			return out
		}
		out = append(out, e.Data)
	}
}

func TestHubEverySubscriberGetsEveryEvent(t *testing.T) {
	h := NewHub(8, nil)
	a := h.Subscribe()
	b := h.Subscribe()
	for i := range 3 {
		h.Publish(ev(i))
	}
	assert.Equal(t, []string{"0", "1", "2"}, drain(t, a))
	assert.Equal(t, []string{"0", "1", "2"}, drain(t, b))
}

func TestHubBacklogForFirstSubscriber(t *testing.T) {
	h := NewHub(4, nil)
	for i := range 6 {
		h.Publish(ev(i))
	}
	s := h.Subscribe()
	assert.Equal(t, []string{"0", "1", "2", "3", "4", "5"}, drain(t, s), "undelivered events are all kept, past the backlog of delivered ones")
}

func TestHubResubscribeLosesNothingAndRepeatsNothing(t *testing.T) {
	h := NewHub(16, nil)
	s := h.Subscribe()
	h.Publish(ev(0))
	h.Publish(ev(1))
	e, err := s.Next(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "0", e.Data)
	s.Ack() // "0" written
	e, err = s.Next(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "1", e.Data) // taken, write fails: not acked
	s.Close()
	h.Publish(ev(2)) // nobody listening
	s2 := h.Subscribe()
	assert.Equal(t, []string{"1", "2"}, drain(t, s2))
	s2.Close()
	// drain's final Next acknowledged "2": it is not repeated.
	h.Publish(ev(3))
	s3 := h.Subscribe()
	assert.Equal(t, []string{"3"}, drain(t, s3))
}

func TestHubLiveSubscriberMeansNewOneStartsNow(t *testing.T) {
	h := NewHub(16, nil)
	a := h.Subscribe()
	h.Publish(ev(0))
	b := h.Subscribe()
	h.Publish(ev(1))
	assert.Equal(t, []string{"0", "1"}, drain(t, a))
	assert.Equal(t, []string{"1"}, drain(t, b), "from the moment it subscribed")
}

// A slow subscriber loses nothing the client is owed; a second one that
// lags behind what the first has delivered skips ahead past the backlog.
func TestHubSlowSubscriberSkipsOnlyDelivered(t *testing.T) {
	h := NewHub(4, nil)
	s := h.Subscribe()
	for i := range 10 {
		h.Publish(ev(i))
	}
	assert.Equal(t, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}, drain(t, s))
	lagging := h.Subscribe()
	for i := 10; i < 20; i++ {
		h.Publish(ev(i))
	}
	assert.Len(t, drain(t, s), 10)
	assert.Equal(t, []string{"16", "17", "18", "19"}, drain(t, lagging), "the last 4 delivered")
}

func TestHubNextEndsOnClose(t *testing.T) {
	h := NewHub(4, nil)
	s := h.Subscribe()
	done := make(chan error)
	go func() {
		_, err := s.Next(context.Background())
		done <- err
	}()
	s.Close()
	assert.ErrorIs(t, <-done, ErrSubscriptionClosed)
	s.Close() // twice is fine
}

func TestHubNextWakesOnPublish(t *testing.T) {
	h := NewHub(4, nil)
	s := h.Subscribe()
	got := make(chan protocol.Event)
	go func() {
		e, err := s.Next(context.Background())
		if err == nil {
			got <- e
		}
	}()
	h.Publish(ev(7))
	assert.Equal(t, "7", (<-got).Data)
}

func TestServiceSubscribeAdapter(t *testing.T) {
	e := newTestEnv(t)
	params := json.RawMessage(`{"userDataName":"` + testProfile + `","userDataRoot":"` + testProfileRoot + `"}`)
	e.sub.Close() // the test's own subscriber would make the adapter's start at the newest event
	e.s.Publish(ev(0))
	sub, err := e.h.Subscribe(context.Background(), params)
	require.NoError(t, err)
	assert.Equal(t, "0", (<-sub.Events).Data)
	delivered(sub)
	e.s.Publish(ev(1))
	assert.Equal(t, "1", (<-sub.Events).Data)
	delivered(sub)
	sub.Cancel()
	e.s.Publish(ev(2))
	sub2, err := e.h.Subscribe(context.Background(), params)
	require.NoError(t, err)
	defer sub2.Cancel()
	assert.Equal(t, "2", (<-sub2.Events).Data, "resumes after the last event written, without repeating it")
	_, err = e.h.Subscribe(context.Background(), json.RawMessage(`[`))
	require.Error(t, err)
}

// An event the server took but could not write (no Delivered: the
// connection dropped) goes to the next subscriber; the one after it too.
func TestServiceSubscribeFailedWriteGoesToNextSubscriber(t *testing.T) {
	e := newTestEnv(t)
	params := json.RawMessage(`{"userDataName":"` + testProfile + `","userDataRoot":"` + testProfileRoot + `"}`)
	e.sub.Close()
	e.s.Publish(ev(0))
	e.s.Publish(ev(1))
	sub, err := e.h.Subscribe(context.Background(), params)
	require.NoError(t, err)
	assert.Equal(t, "0", (<-sub.Events).Data)
	delivered(sub)
	assert.Equal(t, "1", (<-sub.Events).Data) // its write fails
	sub.Cancel()
	sub2, err := e.h.Subscribe(context.Background(), params)
	require.NoError(t, err)
	defer sub2.Cancel()
	select {
	case got := <-sub2.Events:
		assert.Equal(t, "1", got.Data, "the event whose write failed is the next subscriber's first")
	case <-time.After(5 * time.Second):
		t.Fatal("the event whose write failed never reached the next subscriber")
	}
}

// Delivered events are kept within MaxBacklogBytes; undelivered ones up to
// the backstop, past which even they go.
func TestHubBacklogIsBoundedInBytes(t *testing.T) {
	h := NewHub(1024, nil)
	chunk := string(make([]byte, 1<<20))
	for range 100 {
		h.Publish(protocol.Event{Type: protocol.EventStdout, ID: "p", Data: chunk})
	}
	h.Publish(ev(1))
	all, owed := h.heldBytes()
	assert.LessOrEqual(t, all, hardBacklogBytes)
	assert.Equal(t, all, owed)
	s := h.Subscribe()
	got := drain(t, s)
	assert.LessOrEqual(t, len(got), hardBacklogBytes>>20+1)
	assert.Equal(t, "1", got[len(got)-1])
	all, owed = h.heldBytes()
	assert.LessOrEqual(t, all, MaxBacklogBytes, "delivered: within the cap")
	assert.Zero(t, owed)
}

// WaitDelivered returns once live subscribers have taken every event; a
// profile without one keeps its backlog and is not waited for.
func TestWaitDelivered(t *testing.T) {
	e := newTestEnv(t)
	e.s.Publish(ev(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	e.h.WaitDelivered(ctx)
	assert.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "the live subscriber has not taken it")
	assert.Equal(t, []string{"0"}, drain(t, e.sub))
	e.h.WaitDelivered(context.Background()) // taken: returns at once
	e.sub.Close()
	e.s.Publish(ev(1))
	e.h.WaitDelivered(context.Background()) // nobody live: the backlog keeps it
}

// delivered tells a subscription the event it handed over was written, as
// the server does.
func delivered(sub *protocol.Subscription) {
	if sub.Delivered != nil {
		sub.Delivered()
	}
}

// Every event counts its whole payload: params, messages, data.
func TestHubCountsWholeEvents(t *testing.T) {
	params := json.RawMessage(`"` + strings.Repeat("x", 1000) + `"`)
	assert.Equal(t, eventOverhead+len("request")+len("7")+len("m")+len(params),
		eventSize(protocol.Event{Type: protocol.EventRequest, ID: "7", Method: "m", Params: params}))
	assert.Equal(t, eventOverhead+len("error")+1000,
		eventSize(protocol.Event{Type: protocol.EventError, Message: strings.Repeat("e", 1000)}))
	h := NewHub(0, nil)
	require.NoError(t, h.PublishWithin(protocol.Event{Type: protocol.EventRequest, Params: params}, 2000))
	assert.ErrorIs(t, h.PublishWithin(protocol.Event{Type: protocol.EventRequest, Params: params}, 2000), errBacklogFull)
}

// Nobody reading, a flood of output past the hard bound: the output goes,
// the exits, errors and requests among it stay, and the hub stays bounded.
func TestHubNeverEvictsExitsForOutput(t *testing.T) {
	h := NewHub(0, nil)
	var lostCredit int
	h.onDelivered = func(_ string, credit int) { lostCredit += credit }
	chunk := strings.Repeat("o", 1<<20)
	code := 0
	for i := range 100 {
		h.PublishOutput(protocol.Event{Type: protocol.EventStdout, ID: "p", Data: chunk}, len(chunk))
		h.Publish(protocol.Event{Type: protocol.EventExit, ID: strconv.Itoa(i), ExitCode: &code})
		h.Publish(protocol.Event{Type: protocol.EventNetworkStatus, Status: protocol.NetworkConnected})
	}
	all, _ := h.heldBytes()
	assert.LessOrEqual(t, all, hardBacklogBytes)
	assert.Positive(t, lostCredit, "the credit of output dropped undelivered is given back")
	exits := 0
	s := h.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		e, err := s.Next(ctx)
		if err != nil {
			break
		}
		if e.Type == protocol.EventExit {
			assert.Equal(t, strconv.Itoa(exits), e.ID, "in order")
			exits++
		}
	}
	assert.Equal(t, 100, exits, "every exit kept")
}

// Status events are superseded: past the cap, undelivered ones go first.
func TestHubEvictsStatusEventsPastTheCap(t *testing.T) {
	h := NewHub(0, nil)
	status := strings.Repeat("s", 1<<20)
	for range 40 {
		h.Publish(protocol.Event{Type: protocol.EventStartupStep, Step: "x", Status: status})
	}
	code := 0
	h.Publish(protocol.Event{Type: protocol.EventExit, ID: "p", ExitCode: &code})
	all, owed := h.heldBytes()
	assert.LessOrEqual(t, all, MaxBacklogBytes)
	assert.Equal(t, all, owed)
	got := drain(t, h.Subscribe())
	assert.Less(t, len(got), 41)
}
