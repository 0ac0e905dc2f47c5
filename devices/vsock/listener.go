package vsock

import (
	"net"
	"sync"
)

// Listener accepts the guest's connections to one host port. It is the
// net.Listener returned by Device.Listen; Accept returns *Conn values.
type Listener struct {
	m    *muxer
	port uint32
	// backlog holds connections the guest opened (RESPONSE already
	// queued) until Accept takes them; when full, more are refused.
	backlog   chan *Conn
	done      chan struct{} // closed by Close
	closeOnce sync.Once
}

var _ net.Listener = (*Listener)(nil)

// Accept waits for the guest to connect and returns the connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.backlog:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "vsock", Addr: l.Addr(), Err: net.ErrClosed}
	}
}

// Close stops listening; connections not yet accepted are reset.
// Accepted connections are not affected.
func (l *Listener) Close() error {
	err := error(&net.OpError{Op: "close", Net: "vsock", Addr: l.Addr(), Err: net.ErrClosed})
	l.closeOnce.Do(func() {
		err = nil
		m := l.m
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.listeners[l.port] == l {
			delete(m.listeners, l.port)
		}
		close(l.done)
		l.drainBacklog(net.ErrClosed)
	})
	return err
}

// drainBacklog resets every connection not yet accepted. Called with m.mu held.
func (l *Listener) drainBacklog(err error) {
	for {
		select {
		case c := <-l.backlog:
			c.hostClosed = true
			c.terminate(err, true)
		default:
			return
		}
	}
}

// Addr returns the host address listened on: CID 2 and the port.
func (l *Listener) Addr() net.Addr { return Addr{CID: HostCID, Port: l.port} }
