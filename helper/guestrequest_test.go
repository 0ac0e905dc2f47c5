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

// waitAnswer waits for the agent's answer to its guest request id.
func waitAnswer(t *testing.T, g *fakeGuest, id uint64) protocol.GuestResponseParams {
	t.Helper()
	var r protocol.GuestResponseParams
	waitFor(t, "the answer to guest request "+strconv.FormatUint(id, 10), func() bool {
		var ok bool
		r, ok = g.agent.answer(id)
		return ok
	})
	return r
}

// TestGuestRequestRoundTrip: an agent's request event becomes a client
// request event (the helper's id, the method, the params as sent) on the
// spawn's profile; the client's sendGuestResponse — with the id as a number
// or a string — is the agent's answer, once: the id is then unknown.
func TestGuestRequestRoundTrip(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "p1", "name": "s", "command": "sh"})

	g.agent.request("p1", protocol.GuestRequest{ID: 7, Method: "askUser", Params: json.RawMessage(`{"q":"ok?","big":12345678901234567890}`)})
	ev := e.next(protocol.EventRequest)
	assert.Equal(t, "askUser", ev.Method)
	params, err := json.Marshal(ev.Params)
	require.NoError(t, err)
	assert.Equal(t, `{"q":"ok?","big":12345678901234567890}`, string(params), "params exactly as the guest sent them")
	assert.Nil(t, ev.GuestRequest, "the agent channel's body is not the client's")
	id, err := strconv.ParseUint(ev.ID, 10, 64)
	require.NoError(t, err, "ids are decimal integers")
	assert.Less(t, id, uint64(1)<<53, "exact in JavaScript")
	assert.Equal(t, 1, guestRequests.waiting(e.s))

	// The client answers with a numeric id and a JSON text in a string.
	raw := json.RawMessage(`{"id":` + ev.ID + `,"resultJson":"{\"answer\":\"yes\"}"}`)
	_, err = e.s.Call(e.ctx, protocol.MethodSendGuestResponse, raw)
	require.NoError(t, err)
	got := waitAnswer(t, g, 7)
	assert.JSONEq(t, `{"answer":"yes"}`, string(got.Result))
	assert.Empty(t, got.Error)
	assert.Zero(t, guestRequests.waiting(e.s))
	err = e.call("sendGuestResponse", map[string]any{"id": ev.ID, "resultJson": "{}"}, nil)
	assert.ErrorContains(t, err, "no guest request", "answered already")

	// A string id and an error.
	g.agent.request("p1", protocol.GuestRequest{ID: 8, Method: "askUser"})
	ev = e.next(protocol.EventRequest)
	params, _ = json.Marshal(ev.Params)
	assert.Equal(t, `{}`, string(params), "no params: {}")
	e.mustCall("sendGuestResponse", map[string]any{"id": ev.ID, "error": "the user said no"}, nil)
	got = waitAnswer(t, g, 8)
	assert.Equal(t, "the user said no", got.Error)
	assert.Nil(t, got.Result)
}

// TestGuestResponseResultForms: resultJson as a JSON text in a string, as
// a value, as a string of something else, or absent.
func TestGuestResponseResultForms(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "p1", "name": "s", "command": "sh"})
	for i, c := range []struct {
		resultJSON string // the sendGuestResponse field, JSON; "" for none
		want       string // what the agent gets; "" for none
	}{
		{`"[1,2]"`, `[1,2]`},
		{`{"a":[true]}`, `{"a":[true]}`},
		{`"hello"`, `"hello"`},
		{`""`, `""`},
		{`null`, ``},
		{``, ``},
	} {
		agentID := uint64(100 + i)
		g.agent.request("p1", protocol.GuestRequest{ID: agentID, Method: "m"})
		ev := e.next(protocol.EventRequest)
		raw := `{"id":"` + ev.ID + `"`
		if c.resultJSON != "" {
			raw += `,"resultJson":` + c.resultJSON
		}
		_, err := e.s.Call(e.ctx, protocol.MethodSendGuestResponse, json.RawMessage(raw+"}"))
		require.NoError(t, err, raw)
		assert.Equal(t, c.want, string(waitAnswer(t, g, agentID).Result), raw)
	}
}

// TestGuestRequestTimeout: a request the client leaves unanswered for its
// timeout is answered with an error, and its id is forgotten.
func TestGuestRequestTimeout(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "p1", "name": "s", "command": "sh"})
	start := time.Now()
	g.agent.request("p1", protocol.GuestRequest{ID: 1, Method: "slow", TimeoutMillis: 1})
	ev := e.next(protocol.EventRequest)
	got := waitAnswer(t, g, 1)
	assert.Equal(t, "no response from the client within 1s", got.Error, "a timeout of 1 ms is raised to the floor")
	assert.GreaterOrEqual(t, time.Since(start), protocol.MinGuestRequestTimeout)
	err := e.call("sendGuestResponse", map[string]any{"id": ev.ID}, nil)
	assert.ErrorContains(t, err, "timed out")
	assert.Equal(t, protocol.DefaultGuestRequestTimeout, protocol.GuestRequestTimeout(0))
	assert.Equal(t, protocol.MaxGuestRequestTimeout, protocol.GuestRequestTimeout(1<<40))
}

// TestGuestRequestBounds: requests of a process unknown to this guest,
// without a method, with params over the limit, and past a session's limit
// of waiting requests are refused to the agent and never reach the client.
func TestGuestRequestBounds(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "p1", "name": "s", "command": "sh"})
	e.spawn(map[string]any{"id": "p2", "name": "s", "command": "sh"})
	e.spawn(map[string]any{"id": "q1", "name": "other", "command": "sh"})

	g.agent.request("nobody", protocol.GuestRequest{ID: 1, Method: "m"})
	assert.Contains(t, waitAnswer(t, g, 1).Error, `no process "nobody"`)
	g.agent.request("p1", protocol.GuestRequest{ID: 2})
	assert.Contains(t, waitAnswer(t, g, 2).Error, "needs a method")
	g.agent.request("p1", protocol.GuestRequest{ID: 3, Method: strings.Repeat("m", protocol.MaxGuestRequestMethodLen+1)})
	assert.Contains(t, waitAnswer(t, g, 3).Error, "needs a method")
	big := json.RawMessage(`"` + strings.Repeat("x", protocol.MaxGuestRequestParamsBytes) + `"`)
	g.agent.request("p1", protocol.GuestRequest{ID: 4, Method: "m", Params: big})
	assert.Contains(t, waitAnswer(t, g, 4).Error, "params are")
	g.agent.emit(protocol.Event{Type: protocol.EventRequest, ID: "p1"}) // no body: dropped

	// The session's limit counts both its processes; another session is
	// not held up by it.
	for i := range protocol.MaxGuestRequestsPerSession {
		g.agent.request([]string{"p1", "p2"}[i%2], protocol.GuestRequest{ID: uint64(10 + i), Method: "wait"})
		e.next(protocol.EventRequest)
	}
	g.agent.request("p2", protocol.GuestRequest{ID: 99, Method: "one too many"})
	assert.Contains(t, waitAnswer(t, g, 99).Error, "session s has 32 guest requests waiting")
	g.agent.request("q1", protocol.GuestRequest{ID: 100, Method: "other session"})
	ev := e.next(protocol.EventRequest)
	assert.Equal(t, "other session", ev.Method, "the refused ones never reached the client")
	assert.Equal(t, protocol.MaxGuestRequestsPerSession+1, guestRequests.waiting(e.s))

	// The guest ends: its requests are dropped at the next count.
	g.die(errCrash)
	e.next(protocol.EventError)
	g2 := e.start()
	e.spawn(map[string]any{"id": "p3", "name": "s", "command": "sh"})
	g2.agent.request("p3", protocol.GuestRequest{ID: 1, Method: "after the restart"})
	ev = e.next(protocol.EventRequest)
	assert.Equal(t, "after the restart", ev.Method)
	assert.Equal(t, 1, guestRequests.waiting(e.s))
}

// TestGuestRequestOfAnotherProfile: a request goes only to its spawn's
// profile, and another profile cannot answer it.
func TestGuestRequestOfAnotherProfile(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	other := e.connect("other", "/other")
	other.start()
	e.spawn(map[string]any{"id": "p1", "name": "s", "command": "sh"})
	g.agent.request("p1", protocol.GuestRequest{ID: 1, Method: "mine"})
	ev := e.next(protocol.EventRequest)
	err := other.call("sendGuestResponse", map[string]any{"id": ev.ID, "resultJson": "1"}, nil)
	assert.ErrorContains(t, err, "no guest request")
	e.mustCall("sendGuestResponse", map[string]any{"id": ev.ID, "resultJson": "2"}, nil)
	assert.Equal(t, "2", string(waitAnswer(t, g, 1).Result))
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	for {
		ev, err := other.sub.Next(ctx)
		if err != nil {
			break
		}
		assert.NotEqual(t, protocol.EventRequest, ev.Type, "the other profile never sees it")
	}
}

// TestExitOOMKillCount: an exit's oomKillCount from the agent is passed on
// when it is a count, and left out otherwise.
func TestExitOOMKillCount(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	for i, c := range []struct {
		n    int
		want *int
	}{{2, ptr(2)}, {0, ptr(0)}, {-1, nil}, {protocol.MaxOOMKillCount + 1, nil}, {protocol.MaxOOMKillCount, ptr(protocol.MaxOOMKillCount)}} {
		id := "p" + strconv.Itoa(i)
		e.spawn(map[string]any{"id": id, "name": "s", "command": "sh"})
		g.agent.exitOOM(id, 137, c.n)
		ev := e.next(protocol.EventExit)
		assert.Equal(t, id, ev.ID)
		assert.Equal(t, c.want, ev.OOMKillCount, "reported %d", c.n)
	}
	e.spawn(map[string]any{"id": "plain", "name": "s", "command": "sh"})
	g.agent.exit("plain", 0)
	assert.Nil(t, e.next(protocol.EventExit).OOMKillCount, "none reported, none sent")
}
