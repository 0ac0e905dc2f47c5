package protocol

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/acceptloop/acceptlooptest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// Issue #15: connections that never send a request must not lock the
// desktop client out.

func TestIdleConnectionsDoNotLockOutTheClient(t *testing.T) {
	ts := startServer(t, &fakeHandler{handle: func(context.Context, string, json.RawMessage) (any, error) {
		return IsRunningResult{Running: true}, nil
	}}, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	defer cancel()
	pipe, err := DialPipe(ctx, ts.path)
	require.NoError(t, err)
	defer pipe.Close()
	_, err = pipe.Call(ctx, MethodConfigure, nil)
	require.NoError(t, err)

	// As many silent connections as the server has slots: before the
	// per-uid bound, the next connection was refused.
	idle := make([]*net.UnixConn, DefaultMaxConns)
	for i := range idle {
		idle[i] = ts.dial(t)
	}
	resp, err := CallOneShot(ctx, ts.path, MethodIsRunning, nil)
	require.NoError(t, err)
	assert.True(t, resp.Success, resp.Error)
	resp, err = pipe.Call(ctx, MethodIsRunning, nil)
	require.NoError(t, err)
	assert.True(t, resp.Success, "a pipe opened before the flood keeps working")

	assertClosedByServer(t, idle[0]) // the oldest gave way
	lines := strings.Count(ts.logs.String(), "sent no request yet; closing the oldest")
	assert.Positive(t, lines)
	assert.LessOrEqual(t, lines, ratelog.DefaultBurst, "%d connections closed, the lines rate-limited", DefaultMaxConns-DefaultMaxIdlePerUID)
}

func TestMaxIdlePerUIDClosesTheOldestWaitingOnly(t *testing.T) {
	ts := startServer(t, &fakeHandler{}, ServerConfig{MaxIdlePerUID: 2})
	a, b, c := ts.dial(t), ts.dial(t), ts.dial(t)
	assertClosedByServer(t, a) // c made a third waiting connection
	for i, conn := range []*net.UnixConn{b, c} {
		sendRaw(t, conn, `{"method":"stopVM","id":1}`)
		_, r := recvJSON(t, conn)
		assert.True(t, r.Success, "connection %d", i)
	}
	assert.Contains(t, ts.logs.String(), "uid=")

	// b and c sent their first request: they no longer count, so two new
	// waiting connections close nothing.
	d, e := ts.dial(t), ts.dial(t)
	for i, conn := range []*net.UnixConn{e, d, b, c} {
		sendRaw(t, conn, `{"method":"stopVM","id":2}`)
		_, r := recvJSON(t, conn)
		assert.True(t, r.Success, "connection %d", i)
	}
}

func TestFirstRequestTimeoutClosesASilentConnection(t *testing.T) {
	ts := startServer(t, &fakeHandler{}, ServerConfig{FirstRequestTimeout: 50 * time.Millisecond})

	silent := ts.dial(t)
	assertClosedByServer(t, silent)
	assert.Contains(t, ts.logs.String(), "client connection sent no request in time; closing it")
	assert.Contains(t, ts.logs.String(), "timeout=50ms")

	// Half a frame header is not a request either.
	partial := ts.dial(t)
	_, err := partial.Write([]byte{0, 0})
	require.NoError(t, err)
	_, err = ReadFrame(partial)
	assert.Error(t, err, "closed by the server")

	// An invalid frame is answered but does not restart the clock.
	invalid := ts.dial(t)
	sendRaw(t, invalid, `not json`)
	_, r := recvJSON(t, invalid)
	assert.False(t, r.Success)
	assertClosedByServer(t, invalid)
}

func TestFirstRequestTimeoutSparesSubscriptionsAndPipes(t *testing.T) {
	events := make(chan Event, 1)
	ts := startServer(t, &fakeHandler{subscribe: func(context.Context, json.RawMessage) (*Subscription, error) {
		return &Subscription{Events: events}, nil
	}}, ServerConfig{FirstRequestTimeout: 50 * time.Millisecond})

	sub := ts.dial(t)
	sendRaw(t, sub, `{"method":"subscribeEvents","params":{}}`)
	_, ack := recvJSON(t, sub)
	require.True(t, ack.Success)
	pipe := ts.dial(t)
	sendRaw(t, pipe, `{"method":"configure","id":1}`)
	_, r := recvJSON(t, pipe)
	require.True(t, r.Success)

	// A connection opened after them times out: their own deadline, had it
	// stayed, would have passed before its.
	later := ts.dial(t)
	assertClosedByServer(t, later)
	time.Sleep(100 * time.Millisecond) // more margin; no assertion depends on its length

	events <- Event{Type: EventNetworkStatus, Status: NetworkConnected}
	m, _ := recvJSON(t, sub)
	assert.Equal(t, map[string]any{"type": "networkStatus", "status": "CONNECTED"}, m, "the idle subscription is still served")
	sendRaw(t, pipe, `{"method":"isRunning","id":2}`)
	_, r = recvJSON(t, pipe)
	assert.True(t, r.Success, "the idle pipe is still served")
	assert.Equal(t, 1, strings.Count(ts.logs.String(), "sent no request in time"))
}

func TestServeRetriesTransientAcceptFailures(t *testing.T) {
	l := acceptlooptest.NewListener(
		acceptlooptest.AcceptError(syscall.EMFILE),
		acceptlooptest.AcceptError(syscall.EMFILE),
		acceptlooptest.AcceptError(syscall.ECONNABORTED),
	)
	logs := &lockedBuffer{}
	srv := NewServer(ServerConfig{Handler: &fakeHandler{}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()

	c := l.Dial()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(safetyTimeout))
	sendRaw(t, c, `{"method":"stopVM"}`)
	_, r := recvJSON(t, c)
	assert.True(t, r.Success, "served after three failed accepts")
	assert.Contains(t, logs.String(), "accept failed; retrying")
	assert.Contains(t, logs.String(), "too many open files")

	require.NoError(t, srv.Close())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrServerClosed)
	case <-time.After(safetyTimeout):
		t.Fatal("Serve did not return after Close")
	}
	select {
	case <-l.Closed():
	default:
		t.Error("the listener was not closed")
	}
}

func TestServeEndsOnAPermanentAcceptFailure(t *testing.T) {
	l := acceptlooptest.NewListener(acceptlooptest.AcceptError(syscall.EINVAL))
	srv := NewServer(ServerConfig{Handler: &fakeHandler{}, Logger: discardLogger()})
	defer srv.Close()
	err := srv.Serve(l)
	assert.ErrorIs(t, err, syscall.EINVAL)
	assert.NotErrorIs(t, err, ErrServerClosed)
}
