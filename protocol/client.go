package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// This file is a small client of the contract, as the desktop client speaks
// it: for tests (end-to-end included) and tools. The helper itself does not
// use it.

// ErrClientClosed is returned by PipeClient calls after Close or after the
// connection failed.
var ErrClientClosed = errors.New("protocol: client connection closed")

// CallOneShot dials socketPath, sends one request without id, half-closes
// and returns the reply. params may be nil.
func CallOneShot(ctx context.Context, socketPath, method string, params any) (Response, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return Response{}, fmt.Errorf("protocol: dial %s: %w", socketPath, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	req, err := newRequest(method, nil, params)
	if err != nil {
		return Response{}, err
	}
	if err := WriteJSON(conn, req); err != nil {
		return Response{}, fmt.Errorf("protocol: send %s: %w", method, err)
	}
	if uc, ok := conn.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	return readResponse(conn)
}

func newRequest(method string, id *uint64, params any) (Request, error) {
	req := Request{Method: method, ID: id}
	if params != nil {
		raw, err := json.Marshal(params)
		if err != nil {
			return Request{}, fmt.Errorf("protocol: marshal params for %s: %w", method, err)
		}
		req.Params = raw
	}
	return req, nil
}

func readResponse(conn net.Conn) (Response, error) {
	body, err := ReadFrame(conn)
	if err != nil {
		return Response{}, fmt.Errorf("protocol: read reply: %w", err)
	}
	var resp Response
	if err := json.Unmarshal(body, &resp); err != nil {
		return Response{}, fmt.Errorf("protocol: decode reply: %w", err)
	}
	return resp, nil
}

// PipeClient is a persistent-pipe connection: concurrent Calls, replies
// matched by id.
type PipeClient struct {
	conn net.Conn
	wmu  sync.Mutex

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan Response
	err     error // set once the reader stops
	done    chan struct{}
}

// DialPipe opens a persistent pipe to socketPath. (The desktop client then
// sends configure {sessionOnly:true}; DialPipe does not.)
func DialPipe(ctx context.Context, socketPath string) (*PipeClient, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("protocol: dial %s: %w", socketPath, err)
	}
	p := &PipeClient{conn: conn, pending: make(map[uint64]chan Response), done: make(chan struct{})}
	go p.readLoop()
	return p, nil
}

func (p *PipeClient) readLoop() {
	var err error
	for {
		var resp Response
		resp, err = readResponse(p.conn)
		if err != nil {
			break
		}
		if resp.ID == nil {
			continue // not ours to match (e.g. an error for an unreadable frame)
		}
		p.mu.Lock()
		ch := p.pending[*resp.ID]
		delete(p.pending, *resp.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
	}
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
	close(p.done)
}

// Call sends one request and waits for its reply (or ctx, or the
// connection's end). A failure reply is returned as a Response with
// Success false, not as an error.
func (p *PipeClient) Call(ctx context.Context, method string, params any) (Response, error) {
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return Response{}, fmt.Errorf("%w: %v", ErrClientClosed, p.err)
	}
	p.nextID++
	id := p.nextID
	ch := make(chan Response, 1)
	p.pending[id] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.pending, id)
		p.mu.Unlock()
	}()

	req, err := newRequest(method, &id, params)
	if err != nil {
		return Response{}, err
	}
	p.wmu.Lock()
	err = WriteJSON(p.conn, req)
	p.wmu.Unlock()
	if err != nil {
		return Response{}, fmt.Errorf("protocol: send %s: %w", method, err)
	}
	select {
	case resp := <-ch:
		return resp, nil
	case <-p.done:
		select {
		case resp := <-ch:
			return resp, nil
		default:
		}
		return Response{}, fmt.Errorf("%w while waiting for %s", ErrClientClosed, method)
	case <-ctx.Done():
		return Response{}, fmt.Errorf("protocol: %s: %w", method, ctx.Err())
	}
}

// Close closes the pipe.
func (p *PipeClient) Close() error { return p.conn.Close() }

// ReplyError is a failure reply ({success:false, error}) as a Go error.
type ReplyError struct {
	Method  string
	Message string
}

func (e *ReplyError) Error() string { return e.Method + ": " + e.Message }

// CallResult is Call for the usual case: a failure reply becomes a
// *ReplyError, and a success's result is decoded into result (unless nil).
func (p *PipeClient) CallResult(ctx context.Context, method string, params, result any) error {
	resp, err := p.Call(ctx, method, params)
	if err != nil {
		return err
	}
	if !resp.Success {
		return &ReplyError{Method: method, Message: resp.Error}
	}
	if result != nil && len(resp.Result) > 0 {
		if err := json.Unmarshal(resp.Result, result); err != nil {
			return fmt.Errorf("protocol: decode %s result: %w", method, err)
		}
	}
	return nil
}

// ErrGuestStopped is returned by WaitGuestConnected when the helper reports
// that no guest is running any more (it failed to boot, or died).
var ErrGuestStopped = errors.New("the guest stopped before its agent connected")

// StartGuest starts the guest as the desktop client's boot sequence does —
// configure (the full variant), then startVM — unless isRunning says one is
// already up, which it then leaves alone (its configuration included).
// started reports whether startVM was sent.
func StartGuest(ctx context.Context, p *PipeClient, configure ConfigureParams, start StartVMParams) (started bool, err error) {
	var running IsRunningResult
	if err := p.CallResult(ctx, MethodIsRunning, nil, &running); err != nil {
		return false, err
	}
	if running.Running {
		return false, nil
	}
	configure.SessionOnly = false
	if err := p.CallResult(ctx, MethodConfigure, configure, nil); err != nil {
		return false, err
	}
	if err := p.CallResult(ctx, MethodStartVM, start, nil); err != nil {
		return true, err
	}
	return true, nil
}

// WaitGuestConnected polls isGuestConnected every interval, as the desktop
// client does after startVM, until the guest agent answers. It fails with
// ErrGuestStopped when isRunning turns false meanwhile, and with ctx's error
// when ctx ends first.
func WaitGuestConnected(ctx context.Context, p *PipeClient, interval time.Duration) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		var connected IsGuestConnectedResult
		if err := p.CallResult(ctx, MethodIsGuestConnected, nil, &connected); err != nil {
			return err
		}
		if connected.Connected {
			return nil
		}
		var running IsRunningResult
		if err := p.CallResult(ctx, MethodIsRunning, nil, &running); err != nil {
			return err
		}
		if !running.Running {
			return ErrGuestStopped
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the guest agent: %w", ctx.Err())
		case <-ticker.C:
		}
	}
}

// EventStream is an event subscription.
type EventStream struct {
	conn net.Conn
}

// SubscribeEvents opens a subscription and checks the ack. params is the
// subscribeEvents params (typically SubscribeEventsParams).
func SubscribeEvents(ctx context.Context, socketPath string, params any) (*EventStream, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("protocol: dial %s: %w", socketPath, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	req, err := newRequest(MethodSubscribeEvents, nil, params)
	if err == nil {
		err = WriteJSON(conn, req)
	}
	var resp Response
	if err == nil {
		resp, err = readResponse(conn)
	}
	if err == nil && !resp.Success {
		err = fmt.Errorf("protocol: subscribeEvents refused: %s", resp.Error)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &EventStream{conn: conn}, nil
}

// Next blocks for the next event.
func (e *EventStream) Next() (Event, error) {
	body, err := ReadFrame(e.conn)
	if err != nil {
		return Event{}, fmt.Errorf("protocol: read event: %w", err)
	}
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return Event{}, fmt.Errorf("protocol: decode event: %w", err)
	}
	return ev, nil
}

// Conn exposes the connection (e.g. to set a read deadline).
func (e *EventStream) Conn() net.Conn { return e.conn }

// Close ends the subscription.
func (e *EventStream) Close() error { return e.conn.Close() }
