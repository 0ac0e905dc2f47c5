// Package fdpass carries egress connections as file descriptors over a Unix
// socket: the process backend's replacement for vsock. The agent (inside
// the sandbox, which has no network) makes a socketpair per connection and
// sends one end to the helper with SCM_RIGHTS (Dialer); the helper receives
// them as net.Conns (Listener) and serves them with egress.Server.
//
// The control socket should be SOCK_SEQPACKET (message boundaries keep one
// descriptor per message); SOCK_STREAM works too.
package fdpass

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// maxFDsPerMessage bounds what one received message may carry; more is a
// protocol violation and every descriptor of that message is closed.
const maxFDsPerMessage = 8

// Dialer makes connections whose far end it hands to the helper. Safe for
// concurrent use.
type Dialer struct {
	Conn *net.UnixConn
	mu   sync.Mutex
}

// DialHost returns one end of a fresh socketpair after sending the other end
// over Conn.
func (d *Dialer) DialHost(ctx context.Context) (net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fdpass: creating a socket pair: %w", err)
	}
	local := os.NewFile(uintptr(fds[0]), "egress-local")
	remote := os.NewFile(uintptr(fds[1]), "egress-remote")
	defer local.Close()
	defer remote.Close()

	d.mu.Lock()
	deadline, _ := ctx.Deadline()
	_ = d.Conn.SetWriteDeadline(deadline)
	_, _, err = d.Conn.WriteMsgUnix([]byte{0}, unix.UnixRights(int(remote.Fd())), nil)
	d.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("fdpass: handing a connection to the helper: %w", err)
	}
	conn, err := net.FileConn(local)
	if err != nil {
		return nil, fmt.Errorf("fdpass: wrapping the socket: %w", err)
	}
	return conn, nil
}

// Listener yields the connections a Dialer sends. Accept is safe for
// concurrent use; it validates every descriptor (a stream Unix socket)
// before wrapping it.
type Listener struct {
	conn *net.UnixConn

	mu      sync.Mutex
	pending []*os.File
}

// NewListener wraps the helper's end of the control socket.
func NewListener(conn *net.UnixConn) *Listener { return &Listener{conn: conn} }

var _ net.Listener = (*Listener)(nil)

// ErrBadDescriptor: the peer sent something that is not a stream Unix socket.
var ErrBadDescriptor = errors.New("fdpass: received descriptor is not a stream Unix socket")

// Accept returns the next passed connection. Bad descriptors are closed and
// skipped; Accept fails only when the control socket does (net.ErrClosed
// after Close, io.EOF-like errors when the agent went away).
func (l *Listener) Accept() (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		for len(l.pending) > 0 {
			f := l.pending[0]
			l.pending = l.pending[1:]
			conn, err := wrap(f)
			if err == nil {
				return conn, nil
			}
			// A hostile agent only hurts itself: drop the descriptor.
		}
		if err := l.receive(); err != nil {
			return nil, err
		}
	}
}

// receive reads one message and queues the descriptors it carries.
func (l *Listener) receive() error {
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(maxFDsPerMessage*4))
	n, oobn, flags, _, err := l.conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return err
	}
	if n == 0 && oobn == 0 {
		return fmt.Errorf("fdpass: the agent closed the egress socket: %w", net.ErrClosed)
	}
	msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
	var fds []int
	if perr == nil {
		for _, m := range msgs {
			if rights, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, rights...)
			}
		}
	}
	if flags&unix.MSG_CTRUNC != 0 || len(fds) > maxFDsPerMessage {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil
	}
	for _, fd := range fds {
		unix.CloseOnExec(fd)
		l.pending = append(l.pending, os.NewFile(uintptr(fd), "egress-passed"))
	}
	return nil
}

// wrap checks that f is a stream Unix socket and makes it a net.Conn.
func wrap(f *os.File) (net.Conn, error) {
	defer f.Close()
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, ErrBadDescriptor
	}
	domain, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	typ, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	listening, err3 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err1 != nil || err2 != nil || err3 != nil || domain != unix.AF_UNIX || typ != unix.SOCK_STREAM || listening != 0 {
		return nil, ErrBadDescriptor
	}
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadDescriptor, err)
	}
	return conn, nil
}

// Close closes the control socket; pending descriptors are closed too.
func (l *Listener) Close() error {
	err := l.conn.Close()
	go func() {
		// Accept may hold the lock while blocked in receive; it returns
		// once the socket is closed, and the queue is freed after it.
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, f := range l.pending {
			f.Close()
		}
		l.pending = nil
	}()
	return err
}

// Addr is the control socket's local address.
func (l *Listener) Addr() net.Addr { return l.conn.LocalAddr() }

// SetDeadline is unused by servers; provided for symmetry with net.UnixListener.
func (l *Listener) SetDeadline(t time.Time) error { return l.conn.SetReadDeadline(t) }
