// Package agenttest is the helper side of the agent channel for tests that
// drive an agent: an agentrpc.Client that gathers each process's output,
// guest requests and exit, and waits for them.
package agenttest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc"
)

// DefaultTimeout bounds each call and each wait unless SetTimeout says
// otherwise: a test that hangs fails instead.
const DefaultTimeout = 60 * time.Second

// Output is what a Client has seen of one process.
type Output struct {
	Stdout, Stderr strings.Builder
	Chunks         []int // sizes of stdout/stderr event data, in order
	Exit           *protocol.Event
	Requests       []protocol.GuestRequest // its guest requests, in order
	Errors         []string                // messages of its error events
}

// Client is an agentrpc.Client whose events are gathered per process.
type Client struct {
	t       testing.TB
	rpc     *agentrpc.Client
	timeout time.Duration

	mu     sync.Mutex
	cond   *sync.Cond
	procs  map[string]*Output
	closed bool // the connection ended, or a wait gave up
}

// Dial reads the agent's hello on conn (failing the test without one).
func Dial(t testing.TB, conn io.ReadWriteCloser) *Client {
	t.Helper()
	c := &Client{t: t, procs: map[string]*Output{}, timeout: DefaultTimeout}
	c.cond = sync.NewCond(&c.mu)
	rpc, err := agentrpc.Dial(context.Background(), conn, slog.New(slog.DiscardHandler), c.onEvent)
	if err != nil {
		t.Fatalf("the agent's hello: %v", err)
	}
	c.rpc = rpc
	go func() {
		<-rpc.Done()
		c.giveUp()
	}()
	return c
}

func (c *Client) giveUp() {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
}

// SetTimeout replaces DefaultTimeout (a nested guest is slow); call it
// before the first call or wait.
func (c *Client) SetTimeout(d time.Duration) { c.timeout = d }

// Hello is the agent's hello.
func (c *Client) Hello() protocol.AgentHello { return c.rpc.Hello() }

func (c *Client) onEvent(ev protocol.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.procs[ev.ID]
	if p == nil {
		p = &Output{}
		c.procs[ev.ID] = p
	}
	switch ev.Type {
	case protocol.EventStdout:
		p.Stdout.WriteString(ev.Data)
		p.Chunks = append(p.Chunks, len(ev.Data))
	case protocol.EventStderr:
		p.Stderr.WriteString(ev.Data)
		p.Chunks = append(p.Chunks, len(ev.Data))
	case protocol.EventRequest:
		if ev.GuestRequest == nil {
			c.t.Errorf("request event of %s without its guestRequest", ev.ID)
		} else {
			p.Requests = append(p.Requests, *ev.GuestRequest)
		}
	case protocol.EventError:
		p.Errors = append(p.Errors, ev.Message)
	case protocol.EventExit:
		if p.Exit != nil {
			c.t.Errorf("second exit event for %s", ev.ID)
		}
		p.Exit = &ev
	}
	c.cond.Broadcast()
}

// Call sends one request and waits for its reply (result may be nil); no
// reply within the timeout fails the test.
func (c *Client) Call(method string, params, result any) error {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	err := c.rpc.Call(ctx, method, params, result)
	if errors.Is(err, context.DeadlineExceeded) {
		c.t.Fatalf("no reply to %s", method)
	}
	return err
}

// WaitFor waits until cond holds for the output of process id; the
// connection's end, or the timeout, fails the test.
func (c *Client) WaitFor(id, what string, cond func(*Output) bool) *Output {
	c.t.Helper()
	timer := time.AfterFunc(c.timeout, c.giveUp)
	defer timer.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		p := c.procs[id]
		if p != nil && cond(p) {
			return p
		}
		if c.closed {
			c.t.Fatalf("process %s: gave up waiting for %s", id, what)
		}
		c.cond.Wait()
	}
}

// WaitExit waits for process id's exit.
func (c *Client) WaitExit(id string) *Output {
	c.t.Helper()
	return c.WaitFor(id, "its exit", func(p *Output) bool { return p.Exit != nil })
}

// WaitClosed waits until the agent closes the connection.
func (c *Client) WaitClosed() {
	<-c.rpc.Done()
}

// Locked runs f with the outputs seen so far, by process id; f may read
// them and forget some (delete), nothing else.
func (c *Client) Locked(f func(procs map[string]*Output)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c.procs)
}
