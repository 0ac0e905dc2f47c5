package agent

import (
	"fmt"
	"io"
	"sync"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// closeLingerSeconds bounds how long closing the connection to the helper
// waits for the host to answer the close (SO_LINGER).
const closeLingerSeconds = 2

// dialVSock dials the helper. The connection's Close lingers: see
// deliveringConn.
func dialVSock() (io.ReadWriteCloser, error) {
	conn, err := vsock.Dial(vsock.Host, guesthost.AgentVSockPort, nil)
	if err != nil {
		return nil, err
	}
	raw, err := conn.SyscallConn()
	if err == nil {
		linger := &unix.Linger{Onoff: 1, Linger: closeLingerSeconds}
		if cerr := raw.Control(func(fd uintptr) {
			err = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, linger)
		}); cerr != nil {
			err = cerr
		}
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("making the connection's close linger: %w", err)
	}
	return &deliveringConn{ReadWriteCloser: conn}, nil
}

// deliveringConn is the agent's connection to the helper, whose close
// (lingering) returns once the host has answered it, or after
// closeLingerSeconds: so what the agent wrote last, the reply to the
// helper's shutdown, has left the guest before powerOff resets the VM.
// Linux's virtio vsock driver moves a written packet onto the virtqueue
// in a work item, which a reset right after the write may never run, and
// the packets of one connection leave in order, the close's last. Close
// is idempotent, and each caller waits for the first to end: Run closes
// the connection from a goroutine of its own, VMMain before it powers off.
type deliveringConn struct {
	io.ReadWriteCloser
	once sync.Once
	err  error
}

func (c *deliveringConn) Close() error {
	c.once.Do(func() { c.err = c.ReadWriteCloser.Close() })
	return c.err
}
