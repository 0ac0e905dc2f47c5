package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// The test client: one-shot calls, a pipe with ids, a subscription, and raw
// frames for the malformed cases. It uses package protocol's small client
// for the well-formed paths and raw sockets for the rest.

const callTimeout = 30 * time.Second // the desktop client's per-call timeout

type client struct {
	t      *testing.T
	socket string
	pipe   *protocol.PipeClient
}

// call makes one pipe call and decodes its result; it fails the test on an
// error reply.
func (c *client) call(method string, params, result any) {
	c.t.Helper()
	resp := c.try(method, params)
	require.True(c.t, resp.Success, "%s failed: %s", method, resp.Error)
	if result != nil {
		require.NotEmpty(c.t, resp.Result, "%s: no result", method)
		require.NoError(c.t, json.Unmarshal(resp.Result, result), "%s result %s", method, resp.Result)
	}
}

// try makes one pipe call and returns the reply, success or not.
func (c *client) try(method string, params any) protocol.Response {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := c.pipe.Call(ctx, method, params)
	require.NoError(c.t, err, method)
	return resp
}

func (c *client) oneShot(method string, params any) protocol.Response {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := protocol.CallOneShot(ctx, c.socket, method, params)
	require.NoError(c.t, err, method)
	return resp
}

// rawConn is a connection on which the test writes frames by hand.
type rawConn struct {
	t    *testing.T
	conn net.Conn
}

func (c *client) dialRaw() *rawConn {
	c.t.Helper()
	conn, err := net.Dial("unix", c.socket)
	require.NoError(c.t, err)
	c.t.Cleanup(func() { conn.Close() })
	return &rawConn{t: c.t, conn: conn}
}

func (r *rawConn) send(v any) {
	r.t.Helper()
	require.NoError(r.t, protocol.WriteJSON(r.conn, v))
}

func (r *rawConn) sendBytes(b []byte) {
	r.t.Helper()
	require.NoError(r.t, protocol.WriteFrame(r.conn, b))
}

func (r *rawConn) read() (protocol.Response, error) {
	_ = r.conn.SetReadDeadline(time.Now().Add(callTimeout))
	body, err := protocol.ReadFrame(r.conn)
	if err != nil {
		return protocol.Response{}, err
	}
	var resp protocol.Response
	if err := json.Unmarshal(body, &resp); err != nil {
		return protocol.Response{}, fmt.Errorf("reply is not JSON: %w: %q", err, body)
	}
	return resp, nil
}

// events collects every event of one subscription.
type events struct {
	t      *testing.T
	stream *protocol.EventStream
	mu     sync.Mutex
	cond   *sync.Cond
	all    []protocol.Event
	at     []time.Time // when each of all arrived
	err    error
}

func subscribe(t *testing.T, socket string, params any) *events {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// SubscribeEvents fails unless the first frame back is the ack.
	stream, err := protocol.SubscribeEvents(ctx, socket, params)
	require.NoError(t, err)
	e := &events{t: t, stream: stream}
	e.cond = sync.NewCond(&e.mu)
	go func() {
		for {
			ev, err := stream.Next()
			e.mu.Lock()
			if err != nil {
				e.err = err
				e.cond.Broadcast()
				e.mu.Unlock()
				return
			}
			e.all = append(e.all, ev)
			e.at = append(e.at, time.Now())
			e.cond.Broadcast()
			e.mu.Unlock()
		}
	}()
	t.Cleanup(func() { stream.Close() })
	return e
}

// wait blocks until some event satisfies match and returns it, failing
// the test after callTimeout.
func (e *events) wait(what string, match func(protocol.Event) bool) protocol.Event {
	e.t.Helper()
	ev, err := e.tryWait(what, callTimeout, match)
	if err != nil {
		e.t.Fatal(err)
	}
	return ev
}

// tryWait is wait that returns an error instead of failing the test.
func (e *events) tryWait(what string, timeout time.Duration, match func(protocol.Event) bool) (protocol.Event, error) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		e.mu.Lock()
		e.cond.Broadcast()
		e.mu.Unlock()
	})
	defer timer.Stop()
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		for _, ev := range e.all {
			if match(ev) {
				return ev, nil
			}
		}
		if e.err != nil {
			return protocol.Event{}, fmt.Errorf("waiting for %s: subscription ended: %w", what, e.err)
		}
		if time.Now().After(deadline) {
			return protocol.Event{}, fmt.Errorf("timed out waiting for %s; events so far: %+v", what, e.all)
		}
		e.cond.Wait()
	}
}

// output concatenates a process's stdout or stderr chunks so far.
func (e *events) output(typ, id string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.outputLocked(typ, id)
}

// outputLocked is output for wait's match functions (e.mu is held).
func (e *events) outputLocked(typ, id string) string {
	var s string
	for _, ev := range e.all {
		if ev.Type == typ && ev.ID == id {
			s += ev.Data
		}
	}
	return s
}

// firstAt is when the first event of process id satisfying match
// arrived; ok is false while none has.
func (e *events) firstAt(id string, match func(protocol.Event) bool) (at time.Time, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, ev := range e.all {
		if ev.ID == id && match(ev) {
			return e.at[i], true
		}
	}
	return time.Time{}, false
}

// exitOK waits up to timeout for id's exit, requires exit status 0 and
// returns when the exit event arrived.
func (e *events) exitOK(id string, timeout time.Duration) time.Time {
	e.t.Helper()
	exit, err := e.tryWait("exit of "+id, timeout, func(ev protocol.Event) bool { return ev.Type == protocol.EventExit && ev.ID == id })
	stdout, stderr := e.output(protocol.EventStdout, id), e.output(protocol.EventStderr, id)
	require.NoError(e.t, err, "stdout %q, stderr %q", stdout, stderr)
	require.NotNil(e.t, exit.ExitCode, "%s: %+v, stderr %q", id, exit, stderr)
	require.Equal(e.t, 0, *exit.ExitCode, "%s: stdout %q, stderr %q", id, stdout, stderr)
	at, _ := e.firstAt(id, func(ev protocol.Event) bool { return ev.Type == protocol.EventExit })
	return at
}

func (e *events) exit(id string) protocol.Event {
	e.t.Helper()
	return e.wait("exit of "+id, func(ev protocol.Event) bool { return ev.Type == protocol.EventExit && ev.ID == id })
}
