package agentrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// HelloTimeout bounds how long a connected agent may take to say hello.
const HelloTimeout = 30 * time.Second

// MaxPendingCalls bounds concurrent requests to one agent; the client's
// own concurrency is far below it.
const MaxPendingCalls = 1024

// ErrGone is returned for calls on an agent connection that has failed.
var ErrGone = errors.New("guest agent connection lost")

// Client speaks the helper side of the agent channel (protocol/agent.go):
// requests with ids, replies matched by id, events handed to onEvent in the
// order the agent sent them. The helper and every test that plays the
// helper use it.
type Client struct {
	conn    io.ReadWriteCloser
	log     *slog.Logger
	onEvent func(protocol.Event)
	hello   protocol.AgentHello

	// writeSlot holds a token while a frame is being written: frames never
	// interleave, and a writer waits for its turn only as long as its
	// call's context allows (a guest that stops reading must not hold every
	// caller behind the one whose write it stalls).
	writeSlot chan struct{}

	// lastFrame is when the last frame of any kind arrived (UnixNano):
	// a guest whose pings time out but whose agent still talks is busy,
	// not dead (the helper's liveness.go, LastReceived).
	lastFrame atomic.Int64

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan protocol.AgentFrame
	err     error         // set once the connection has failed
	done    chan struct{} // closed when the read loop ends
}

// Dial reads the agent's hello (within HelloTimeout and ctx) and starts
// the read loop. onEvent (may be nil) is called from the read loop, one
// event at a time: a slow onEvent holds back the replies behind it. On an
// error conn is closed.
func Dial(ctx context.Context, conn io.ReadWriteCloser, log *slog.Logger, onEvent func(protocol.Event)) (*Client, error) {
	type helloResult struct {
		hello protocol.AgentHello
		err   error
	}
	ch := make(chan helloResult, 1)
	go func() {
		h, err := ReadHello(conn)
		ch <- helloResult{h, err}
	}()
	ctx, cancel := context.WithTimeout(ctx, HelloTimeout)
	defer cancel()
	var hello protocol.AgentHello
	select {
	case r := <-ch:
		if r.err != nil {
			conn.Close()
			return nil, r.err
		}
		hello = r.hello
	case <-ctx.Done():
		conn.Close()
		return nil, fmt.Errorf("waiting for the guest agent's hello: %w", ctx.Err())
	}
	c := &Client{
		conn:      conn,
		log:       log,
		onEvent:   onEvent,
		hello:     hello,
		pending:   make(map[uint64]chan protocol.AgentFrame),
		done:      make(chan struct{}),
		writeSlot: make(chan struct{}, 1),
	}
	go c.readLoop()
	return c, nil
}

// ReadHello reads the agent's first frame, which must be a hello of this
// tree's AgentProtocolVersion.
func ReadHello(r io.Reader) (protocol.AgentHello, error) {
	body, err := protocol.ReadFrame(r)
	if err != nil {
		return protocol.AgentHello{}, fmt.Errorf("reading the guest agent's hello: %w", err)
	}
	var f protocol.AgentFrame
	if err := json.Unmarshal(body, &f); err != nil {
		return protocol.AgentHello{}, fmt.Errorf("guest agent's hello is not valid JSON: %w", err)
	}
	if f.Kind != protocol.AgentKindHello || f.Hello == nil {
		return protocol.AgentHello{}, fmt.Errorf("guest agent's first frame is %q, want %q", f.Kind, protocol.AgentKindHello)
	}
	if f.Hello.Version != protocol.AgentProtocolVersion {
		return protocol.AgentHello{}, fmt.Errorf("guest agent speaks protocol version %d, this helper %d: rebuild both from the same tree",
			f.Hello.Version, protocol.AgentProtocolVersion)
	}
	return *f.Hello, nil
}

func (c *Client) readLoop() {
	var err error
	for {
		var body []byte
		body, err = protocol.ReadFrame(c.conn)
		if err != nil {
			break
		}
		c.lastFrame.Store(time.Now().UnixNano())
		var f protocol.AgentFrame
		if jerr := json.Unmarshal(body, &f); jerr != nil {
			err = fmt.Errorf("guest agent sent invalid JSON: %w", jerr)
			break
		}
		switch f.Kind {
		case protocol.AgentKindReply:
			c.mu.Lock()
			ch := c.pending[f.ID]
			delete(c.pending, f.ID)
			c.mu.Unlock()
			if ch == nil {
				c.log.Debug("agent reply for an unknown request", "id", f.ID)
				continue
			}
			ch <- f // buffered, never blocks
		case protocol.AgentKindEvent:
			if f.Event != nil && c.onEvent != nil {
				c.onEvent(*f.Event)
			}
		default:
			c.log.Debug("agent frame of unexpected kind ignored", "kind", f.Kind)
		}
	}
	if errors.Is(err, io.EOF) {
		err = ErrGone
	} else {
		err = fmt.Errorf("%w: %w", ErrGone, err)
	}
	c.mu.Lock()
	c.err = err
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, ch := range pending {
		ch <- protocol.AgentFrame{} // ID 0: no reply, the connection failed
	}
	c.conn.Close()
	close(c.done)
}

// Call sends one request and waits for its reply. result may be nil. ctx
// bounds both: the write too (send). A call whose ctx ends leaves the
// connection usable.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	call, err := c.Begin(ctx, method, params)
	if err != nil {
		return err
	}
	return call.Wait(ctx, result)
}

// PendingCall is a request sent and waiting for its reply.
type PendingCall struct {
	c      *Client
	method string
	id     uint64
	reply  chan protocol.AgentFrame
}

// Begin sends one request, its write bounded by ctx; Wait takes its reply.
// A caller may give the two different bounds (shutdown: a guest that does
// not even read the request is not waited for as long as its answer).
func (c *Client) Begin(ctx context.Context, method string, params any) (*PendingCall, error) {
	var raw json.RawMessage
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return nil, fmt.Errorf("agent %s: encoding params: %w", method, err)
		}
		raw = b
	}
	ch := make(chan protocol.AgentFrame, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	if len(c.pending) >= MaxPendingCalls {
		c.mu.Unlock()
		return nil, fmt.Errorf("agent %s: too many requests in flight", method)
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()

	if err := c.send(ctx, protocol.AgentFrame{Kind: protocol.AgentKindRequest, ID: id, Method: method, Params: raw}); err != nil {
		c.forget(id)
		return nil, fmt.Errorf("agent %s: %w", method, err)
	}
	return &PendingCall{c: c, method: method, id: id, reply: ch}, nil
}

// Wait waits for the call's reply, or ctx, and decodes its result into
// result (may be nil).
func (call *PendingCall) Wait(ctx context.Context, result any) error {
	method := call.method
	select {
	case f := <-call.reply:
		if f.ID == 0 {
			return fmt.Errorf("agent %s: %w", method, call.c.Err())
		}
		if f.Error != "" {
			return fmt.Errorf("agent %s: %s", method, f.Error)
		}
		if result != nil {
			if len(f.Result) == 0 {
				return fmt.Errorf("agent %s: reply has no result", method)
			}
			if err := json.Unmarshal(f.Result, result); err != nil {
				return fmt.Errorf("agent %s: decoding result: %w", method, err)
			}
		}
		return nil
	case <-ctx.Done():
		call.c.forget(call.id)
		return fmt.Errorf("agent %s: %w", method, ctx.Err())
	}
}

// deadlineWriter is a connection whose writes take a deadline (a net.Conn:
// the backends' sockets and vsock connections, net.Pipe).
type deadlineWriter interface {
	SetWriteDeadline(t time.Time) error
}

// send writes one frame, bounded by ctx: waiting for its turn, and the
// write itself. A write cut short before its first byte leaves the stream
// as it was; one cut short mid-frame is finished in the background (the
// frames after it must start on a frame boundary), still holding the turn,
// until the guest reads it or the connection closes — the ping loop closes
// one that stays stalled. A connection without write deadlines is closed
// when ctx ends mid-write, as is one whose write failed otherwise: the
// stream is then unsynchronised.
func (c *Client) send(ctx context.Context, f protocol.AgentFrame) error {
	body, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encoding the request: %w", err)
	}
	var frame bytes.Buffer
	if err := protocol.WriteFrame(&frame, body); err != nil {
		return err
	}
	select {
	case c.writeSlot <- struct{}{}:
	case <-c.done:
		return c.Err()
	case <-ctx.Done():
		return fmt.Errorf("the guest agent is not reading its connection (an earlier request is still being written): %w", ctx.Err())
	}
	_, deadlines := c.conn.(deadlineWriter)
	n, err := c.writeBounded(ctx, frame.Bytes())
	stalled := err != nil && ctx.Err() != nil && deadlines
	switch {
	case err == nil, stalled && n == 0:
		<-c.writeSlot
	case stalled:
		go c.finishFrame(frame.Bytes()[n:])
	default:
		c.conn.Close()
		<-c.writeSlot
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("the guest agent did not read the request (%d of %d bytes written): %w", n, frame.Len(), ctx.Err())
	default:
		return fmt.Errorf("%w: %w", ErrGone, err)
	}
}

// writeBounded writes b, cut short when ctx ends: by a write deadline in
// the past where the connection has them, else by closing it.
func (c *Client) writeBounded(ctx context.Context, b []byte) (int, error) {
	dw, deadlines := c.conn.(deadlineWriter)
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(interrupted)
		if deadlines {
			_ = dw.SetWriteDeadline(time.Unix(1, 0))
		} else {
			c.conn.Close()
		}
	})
	n, err := c.conn.Write(b)
	if !stop() {
		<-interrupted
	}
	if deadlines {
		_ = dw.SetWriteDeadline(time.Time{})
	}
	return n, err
}

// finishFrame writes the rest of a frame whose caller gave up mid-write,
// then gives the turn up (send).
func (c *Client) finishFrame(rest []byte) {
	defer func() { <-c.writeSlot }()
	if _, err := c.conn.Write(rest); err != nil {
		c.conn.Close()
	}
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	if c.pending != nil {
		delete(c.pending, id)
	}
	c.mu.Unlock()
}

// Done is closed when the connection has failed or been closed.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err says why the connection ended (nil while alive).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection; pending calls fail.
func (c *Client) Close() error { return c.conn.Close() }

// Hello is what the agent said in its hello.
func (c *Client) Hello() protocol.AgentHello { return c.hello }

// LastReceived is when the agent's last frame arrived (the zero time:
// none since the hello).
func (c *Client) LastReceived() time.Time {
	n := c.lastFrame.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
