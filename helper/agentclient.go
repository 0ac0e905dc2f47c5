package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// helloTimeout bounds how long a connected agent may take to say hello.
const helloTimeout = 30 * time.Second

// maxPendingAgentCalls bounds concurrent requests to one agent; the client's
// own concurrency is far below it.
const maxPendingAgentCalls = 1024

// errAgentGone is returned for calls on an agent connection that has failed.
var errAgentGone = errors.New("guest agent connection lost")

// agentClient speaks the helper side of the agent channel (protocol/agent.go):
// requests with ids, replies matched by id, events handed to onEvent in the
// order the agent sent them.
type agentClient struct {
	conn    io.ReadWriteCloser
	log     *slog.Logger
	onEvent func(protocol.Event)
	hello   protocol.AgentHello

	writeMu sync.Mutex

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan protocol.AgentFrame
	err     error         // set once the connection has failed
	done    chan struct{} // closed when the read loop ends
}

// dialAgent reads the agent's hello and starts the read loop. onEvent is
// called from the read loop, one event at a time.
func dialAgent(ctx context.Context, conn io.ReadWriteCloser, log *slog.Logger, onEvent func(protocol.Event)) (*agentClient, error) {
	type helloResult struct {
		hello protocol.AgentHello
		err   error
	}
	ch := make(chan helloResult, 1)
	go func() {
		h, err := readHello(conn)
		ch <- helloResult{h, err}
	}()
	ctx, cancel := context.WithTimeout(ctx, helloTimeout)
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
	c := &agentClient{
		conn:    conn,
		log:     log,
		onEvent: onEvent,
		hello:   hello,
		pending: make(map[uint64]chan protocol.AgentFrame),
		done:    make(chan struct{}),
	}
	go c.readLoop()
	return c, nil
}

func readHello(r io.Reader) (protocol.AgentHello, error) {
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

func (c *agentClient) readLoop() {
	var err error
	for {
		var body []byte
		body, err = protocol.ReadFrame(c.conn)
		if err != nil {
			break
		}
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
		err = errAgentGone
	} else {
		err = fmt.Errorf("%w: %w", errAgentGone, err)
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

// Call sends one request and waits for its reply. result may be nil.
func (c *agentClient) Call(ctx context.Context, method string, params, result any) error {
	var raw json.RawMessage
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return fmt.Errorf("agent %s: encoding params: %w", method, err)
		}
		raw = b
	}
	ch := make(chan protocol.AgentFrame, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	if len(c.pending) >= maxPendingAgentCalls {
		c.mu.Unlock()
		return fmt.Errorf("agent %s: too many requests in flight", method)
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()

	c.writeMu.Lock()
	err := protocol.WriteJSON(c.conn, protocol.AgentFrame{Kind: protocol.AgentKindRequest, ID: id, Method: method, Params: raw})
	c.writeMu.Unlock()
	if err != nil {
		c.forget(id)
		// A failed write leaves the stream unsynchronised.
		c.conn.Close()
		return fmt.Errorf("agent %s: %w: %w", method, errAgentGone, err)
	}

	select {
	case f := <-ch:
		if f.ID == 0 {
			return fmt.Errorf("agent %s: %w", method, c.Err())
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
		c.forget(id)
		return fmt.Errorf("agent %s: %w", method, ctx.Err())
	}
}

func (c *agentClient) forget(id uint64) {
	c.mu.Lock()
	if c.pending != nil {
		delete(c.pending, id)
	}
	c.mu.Unlock()
}

// Done is closed when the connection has failed or been closed.
func (c *agentClient) Done() <-chan struct{} { return c.done }

// Err says why the connection ended (nil while alive).
func (c *agentClient) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection; pending calls fail.
func (c *agentClient) Close() error { return c.conn.Close() }
