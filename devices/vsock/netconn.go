package vsock

// The net.Conn methods of a Conn: what host code calls on a connection.
// The connection's protocol state machine is in connection.go.

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

var _ net.Conn = (*Conn)(nil)

// LocalAddr returns the host end: CID 2 and the host port.
func (c *Conn) LocalAddr() net.Addr { return Addr{CID: HostCID, Port: c.key.local} }

// RemoteAddr returns the guest end: the guest's CID and port.
func (c *Conn) RemoteAddr() net.Addr { return Addr{CID: c.m.cfg.GuestCID, Port: c.key.peer} }

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "vsock", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Read reads data the guest sent. It returns io.EOF once the guest has shut
// down its sending side (or closed, or reset the connection) and every byte
// before that was read. Safe for concurrent use.
func (c *Conn) Read(p []byte) (int, error) {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		switch {
		case c.hostClosed:
			return 0, c.opErr("read", net.ErrClosed)
		case isClosed(c.readDeadline.expired()):
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		case len(p) == 0:
			return 0, nil
		case c.rx.Len() > 0:
			n := c.rx.Read(p)
			c.consumed(n)
			return n, nil
		case c.err != nil:
			return 0, c.opErr("read", c.err)
		case c.peerShut&ShutdownSend != 0 || c.state == stateClosed:
			return 0, io.EOF
		}
		wake := c.wake
		m.mu.Unlock()
		select {
		case <-wake:
		case <-c.readDeadline.expired():
		}
		m.mu.Lock()
	}
}

// Buffered returns how many bytes from the guest are waiting to be read.
func (c *Conn) Buffered() int {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.rx.Len()
}

// Write sends p to the guest. It blocks until every byte is accepted, which
// needs the guest to grant credit: at most the guest's free receive buffer
// is ever in flight, and at most Config.TxBufferSize bytes wait here.
// Concurrent Writes do not interleave.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	total := 0
	for len(p) > 0 {
		switch {
		case c.hostClosed:
			return total, c.opErr("write", net.ErrClosed)
		case isClosed(c.writeDeadline.expired()):
			return total, c.opErr("write", os.ErrDeadlineExceeded)
		case c.err != nil:
			return total, c.opErr("write", c.err)
		case c.localShut&ShutdownSend != 0, c.peerShut&ShutdownRcv != 0, c.state == stateClosed:
			return total, c.opErr("write", syscall.EPIPE)
		case c.state == stateConnected:
			credit := c.peerCredit()
			if n := min(len(p), credit, c.tx.Free()); n > 0 {
				c.tx.Write(p[:n])
				c.txCnt += uint32(n)
				p = p[n:]
				total += n
				m.schedule(c)
				continue
			}
			if credit == 0 && !c.creditRequested {
				// Ask once per stall; a change of credit re-arms this.
				c.creditRequested = true
				c.needCreditRequest = true
				m.schedule(c)
			}
		}
		wake := c.wake
		m.mu.Unlock()
		select {
		case <-wake:
		case <-c.writeDeadline.expired():
		}
		m.mu.Lock()
	}
	return total, nil
}

// CloseWrite shuts down the sending side: once the data already written has
// reached the guest, the guest's reader sees EOF. Reading continues.
func (c *Conn) CloseWrite() error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case c.hostClosed:
		return c.opErr("close", net.ErrClosed)
	case c.state == stateClosed:
		if c.err != nil {
			return c.opErr("close", c.err)
		}
		return nil
	}
	if c.localShut&ShutdownSend == 0 {
		c.localShut |= ShutdownSend
		m.schedule(c)
		c.signal()
	}
	return nil
}

// Close closes the connection: unread data is dropped, data already
// written is still delivered (within Config.CloseTimeout), then the guest
// is told both directions are shut. Blocked Reads and Writes return.
func (c *Conn) Close() error {
	m := c.m
	m.mu.Lock()
	if c.hostClosed {
		m.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.hostClosed = true
	c.startClose()
	m.mu.Unlock()
	// Release the deadline timers.
	c.readDeadline.set(time.Time{})
	c.writeDeadline.set(time.Time{})
	return nil
}

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.readDeadline.set(t)
	c.writeDeadline.set(t)
	return nil
}

// SetReadDeadline sets the deadline for Read calls, pending ones included.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.readDeadline.set(t)
	return nil
}

// SetWriteDeadline sets the deadline for Write calls, pending ones included.
// A Write that times out may have sent part of its data (the count says).
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.writeDeadline.set(t)
	return nil
}
