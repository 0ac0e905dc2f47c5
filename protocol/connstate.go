package protocol

import (
	"context"
	"sync"
)

// ConnState is what a Handler keeps for one client connection between its
// calls: the helper keeps the profile that a pipe's configure named, so
// that the pipe's later calls act on that profile. The Server puts a fresh
// ConnState in the context of every call it makes for a connection
// (ConnStateFrom); a one-shot connection's holds nothing, since its only
// call is its first. Safe for concurrent use: a pipe's calls run at once.
type ConnState struct {
	mu  sync.Mutex
	val any
}

// Set stores v for the connection's later calls.
func (c *ConnState) Set(v any) {
	c.mu.Lock()
	c.val = v
	c.mu.Unlock()
}

// Get returns what Set stored, or nil.
func (c *ConnState) Get() any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.val
}

type connStateKey struct{}

// WithConnState returns ctx carrying a fresh ConnState: what the Server
// does for each connection, and what an in-process caller (a test) does to
// play one connection.
func WithConnState(ctx context.Context) context.Context {
	return context.WithValue(ctx, connStateKey{}, &ConnState{})
}

// ConnStateFrom returns the ConnState of the connection a call came on, or
// nil when ctx carries none (a call made in-process, not by the Server).
func ConnStateFrom(ctx context.Context) *ConnState {
	c, _ := ctx.Value(connStateKey{}).(*ConnState)
	return c
}
