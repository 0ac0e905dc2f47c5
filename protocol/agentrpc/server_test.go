package agentrpc

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// serverPair serves methods on one end of a pipe and dials the other; the
// returned channel gets Serve's result.
func serverPair(t *testing.T, methods map[string]Handler, opts ServerOptions, onEvent func(protocol.Event)) (*Client, *Server, <-chan error) {
	t.Helper()
	helperEnd, agentEnd := net.Pipe()
	t.Cleanup(func() { helperEnd.Close(); agentEnd.Close() })
	s := NewServer(agentEnd, methods, opts)
	served := make(chan error, 1)
	go func() {
		if err := s.SendHello(protocol.AgentHello{Version: protocol.AgentProtocolVersion, PID: 7}); err != nil {
			served <- err
			return
		}
		served <- s.Serve(context.Background())
	}()
	c, err := Dial(context.Background(), helperEnd, slog.New(slog.DiscardHandler), onEvent)
	require.NoError(t, err)
	return c, s, served
}

// The server's typed handlers decode params, encode results and errors;
// events reach the client's callback; an unknown method and missing or
// bad params are errors in the reply, not the end of the connection.
func TestServerTypedHandlers(t *testing.T) {
	events := make(chan protocol.Event, 1)
	var s *Server
	methods := map[string]Handler{
		protocol.AgentMethodReadFile: Handle(func(_ context.Context, p protocol.ReadFileParams) (protocol.ReadFileResult, error) {
			return protocol.ReadFileResult{Content: []byte(p.Path)}, nil
		}),
		protocol.AgentMethodKill: HandleNoResult(func(_ context.Context, p protocol.KillParams) error {
			if p.ID == "" {
				return errors.New("no such process")
			}
			return s.Emit(protocol.Event{Type: protocol.EventExit, ID: p.ID, Signal: p.Signal})
		}),
	}
	c, srv, _ := serverPair(t, methods, ServerOptions{}, func(ev protocol.Event) { events <- ev })
	s = srv
	assert.Equal(t, 7, c.Hello().PID)
	ctx := context.Background()

	var r protocol.ReadFileResult
	require.NoError(t, c.Call(ctx, protocol.AgentMethodReadFile, protocol.ReadFileParams{Path: "/a"}, &r))
	assert.Equal(t, "/a", string(r.Content))

	require.NoError(t, c.Call(ctx, protocol.AgentMethodKill, protocol.KillParams{ID: "p", Signal: "SIGTERM"}, nil))
	assert.Equal(t, protocol.Event{Type: protocol.EventExit, ID: "p", Signal: "SIGTERM"}, <-events)
	assert.ErrorContains(t, c.Call(ctx, protocol.AgentMethodKill, protocol.KillParams{}, nil), "no such process")

	assert.ErrorContains(t, c.Call(ctx, "nope", nil, nil), `unknown agent method "nope"`)
	assert.ErrorContains(t, c.Call(ctx, protocol.AgentMethodKill, nil, nil), "missing params")
	assert.ErrorContains(t, c.Call(ctx, protocol.AgentMethodKill, []int{1}, nil), "invalid params")
	assert.False(t, c.LastReceived().IsZero())
	require.NoError(t, c.Err(), "the connection survives bad requests")
}

// Requests are served concurrently up to MaxInFlight: the one past the
// bound waits for a slot.
func TestServerBoundsRequestsInFlight(t *testing.T) {
	release := make(chan struct{})
	var running, most atomic.Int32
	methods := map[string]Handler{"block": func(context.Context, json.RawMessage) (any, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		return nil, nil
	}}
	c, _, _ := serverPair(t, methods, ServerOptions{MaxInFlight: 2}, nil)
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- c.Call(context.Background(), "block", nil, nil) }()
	}
	require.Eventually(t, func() bool { return running.Load() == 2 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the third would have started by now
	assert.EqualValues(t, 2, running.Load())
	close(release)
	for range 3 {
		require.NoError(t, <-errs)
	}
	assert.EqualValues(t, 2, most.Load())
}

// The Final method is served inline: its reply is written, then the
// connection closes and Serve returns nil. A failed Final does not end it.
func TestServerFinalMethod(t *testing.T) {
	fail := true
	methods := map[string]Handler{protocol.AgentMethodShutdown: func(context.Context, json.RawMessage) (any, error) {
		if fail {
			fail = false
			return nil, errors.New("invalid shutdown params")
		}
		return nil, nil
	}}
	c, _, served := serverPair(t, methods, ServerOptions{Final: []string{protocol.AgentMethodShutdown}}, nil)
	ctx := context.Background()
	require.ErrorContains(t, c.Call(ctx, protocol.AgentMethodShutdown, nil, nil), "invalid shutdown params")
	require.NoError(t, c.Call(ctx, protocol.AgentMethodShutdown, nil, nil))
	require.NoError(t, <-served)
	<-c.Done()
	assert.ErrorIs(t, c.Err(), ErrGone)
}

// A handler's context ends when Serve does (the connection closed), so a
// handler that waits on it does not keep Serve from returning.
func TestServerHandlerContextEndsWithServe(t *testing.T) {
	started := make(chan struct{})
	methods := map[string]Handler{"hang": func(ctx context.Context, _ json.RawMessage) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	c, _, served := serverPair(t, methods, ServerOptions{}, nil)
	go func() { _ = c.Call(context.Background(), "hang", nil, nil) }()
	<-started
	c.Close()
	select {
	case err := <-served:
		assert.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the connection closed")
	}
}

// FuzzServeFrame feeds one arbitrary frame body to a server, then ends the
// stream: it never panics, answers a request (or a frame naming an id)
// with one reply, and Serve returns io.EOF.
func FuzzServeFrame(f *testing.F) {
	f.Add([]byte(`{"kind":"hello","hello":{"version":1,"pid":1}}`))
	f.Add([]byte(`{"kind":"request","id":1,"method":"spawn","params":{"id":"p"}}`))
	f.Add([]byte(`{"kind":"request","id":2,"method":"ping"}`))
	f.Add([]byte(`{"kind":"event","event":{"type":"stdout","id":"p","data":"x"}}`))
	f.Add([]byte(`{"kind":"reply","id":0}`))
	methods := map[string]Handler{
		protocol.AgentMethodPing:  func(context.Context, json.RawMessage) (any, error) { return nil, nil },
		protocol.AgentMethodSpawn: HandleNoResult(func(context.Context, protocol.SpawnParams) error { return nil }),
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		helperEnd, agentEnd := net.Pipe()
		defer agentEnd.Close()
		s := NewServer(agentEnd, methods, ServerOptions{})
		served := make(chan error, 1)
		go func() { served <- s.Serve(context.Background()) }()
		wrote := make(chan struct{})
		go func() { _ = protocol.WriteFrame(helperEnd, body); close(wrote) }()
		var sent protocol.AgentFrame
		wantReply := len(body) <= protocol.MaxFrameSize && json.Unmarshal(body, &sent) == nil && sent.ID != 0
		if wantReply {
			helperEnd.SetReadDeadline(time.Now().Add(5 * time.Second))
			reply, err := protocol.ReadFrame(helperEnd)
			require.NoError(t, err)
			var r protocol.AgentFrame
			require.NoError(t, json.Unmarshal(reply, &r))
			assert.Equal(t, protocol.AgentKindReply, r.Kind)
			assert.Equal(t, sent.ID, r.ID)
		}
		// The stream ends after the whole frame: closing it while the
		// body is still being written would cut the frame (an unexpected
		// EOF, rightly), which is not what this input is about.
		if len(body) <= protocol.MaxFrameSize {
			select {
			case <-wrote:
			case <-time.After(5 * time.Second):
				t.Fatal("the server stopped reading in the middle of a frame")
			}
		}
		helperEnd.Close()
		select {
		case err := <-served:
			assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe), "%v", err)
		case <-time.After(5 * time.Second):
			t.Fatal("Serve did not return after the stream ended")
		}
	})
}
