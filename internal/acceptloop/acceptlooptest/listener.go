// Package acceptlooptest provides a net.Listener double for accept loops:
// its Accept fails with scripted errors first, then hands out the server
// ends of in-memory connections made by Dial.
package acceptlooptest

import (
	"net"
	"os"
	"sync"
	"syscall"
)

// AcceptError is the error a real listener's Accept returns for errno, as
// the net package wraps it.
func AcceptError(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "unix", Addr: Addr{}, Err: os.NewSyscallError("accept4", errno)}
}

// Addr is the Listener's address.
type Addr struct{}

// Network implements net.Addr.
func (Addr) Network() string { return "fake" }

// String implements net.Addr.
func (Addr) String() string { return "acceptlooptest" }

// Listener is a net.Listener whose Accept returns the scripted errors one
// per call, in order, then the connections queued by Dial, until Close.
// Safe for concurrent use.
type Listener struct {
	conns chan net.Conn
	done  chan struct{}

	mu        sync.Mutex
	errs      []error
	accepts   int
	closeOnce sync.Once
}

var _ net.Listener = (*Listener)(nil)

// NewListener returns a listener whose first len(errs) Accept calls fail
// with errs.
func NewListener(errs ...error) *Listener {
	return &Listener{conns: make(chan net.Conn, 64), done: make(chan struct{}), errs: errs}
}

// Dial queues the server end of a new net.Pipe for Accept and returns the
// client end. It blocks while 64 connections are already queued.
func (l *Listener) Dial() net.Conn {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
	case <-l.done:
		_ = server.Close()
	}
	return client
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	l.mu.Lock()
	l.accepts++
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.mu.Unlock()
		return nil, err
	}
	l.mu.Unlock()
	select {
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "fake", Addr: Addr{}, Err: net.ErrClosed}
	default:
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "fake", Addr: Addr{}, Err: net.ErrClosed}
	}
}

// Accepts is how many times Accept was called.
func (l *Listener) Accepts() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.accepts
}

// Close implements net.Listener: Accept fails with net.ErrClosed from now
// on, connections not yet accepted are closed, and Closed is closed.
// Closing twice is not an error.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		for {
			select {
			case c := <-l.conns:
				_ = c.Close()
			default:
				return
			}
		}
	})
	return nil
}

// Closed is closed once Close was called.
func (l *Listener) Closed() <-chan struct{} { return l.done }

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return Addr{} }
