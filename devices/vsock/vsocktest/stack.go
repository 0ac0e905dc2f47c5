package vsocktest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
)

// Stack is the protocol half of the guest: connections, listeners and
// credit, as a Linux guest's virtio transport keeps them. It sends packets
// through send and is fed the packets the device delivers through Deliver.
// It enforces the host's credit on every send and records (Violations)
// every time the host breaks the protocol: data beyond the credit we
// advertised, packets for the wrong CID, RW before RESPONSE.
type Stack struct {
	cid      uint64
	bufAlloc uint32
	send     func(h vsock.Header, data []byte) error

	mu         sync.Mutex
	conns      map[stackKey]*GuestConn
	listeners  map[uint32]*GuestListener
	nextPort   uint32
	violations []string
	// received counts every packet the host sent, by op.
	received map[uint16]int
	// ignoreShutdown makes the stack sit on a full SHUTDOWN instead of
	// answering RST, as a stuck or hostile guest would.
	ignoreShutdown bool
}

// SetIgnoreShutdown makes the guest not answer the host's SHUTDOWN(both)
// with RST (a stuck guest), to test the host's close timeout.
func (s *Stack) SetIgnoreShutdown(ignore bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ignoreShutdown = ignore
}

type stackKey struct{ local, peer uint32 } // guest port, host port

// NewStack returns a guest stack for cid whose connections advertise
// bufAlloc bytes of receive buffer. send must post one packet on the tx
// queue (it may block until there is room) and must not call back into the
// stack.
func NewStack(cid uint64, bufAlloc uint32, send func(h vsock.Header, data []byte) error) *Stack {
	return &Stack{
		cid:       cid,
		bufAlloc:  bufAlloc,
		send:      send,
		conns:     make(map[stackKey]*GuestConn),
		listeners: make(map[uint32]*GuestListener),
		nextPort:  50000,
		received:  make(map[uint16]int),
	}
}

// Violations returns the protocol violations the host committed so far.
func (s *Stack) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}

// Received returns how many packets with op the host delivered so far.
func (s *Stack) Received(op uint16) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received[op]
}

func (s *Stack) violation(format string, args ...any) {
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

// header builds a guest→host header for c.
func (c *GuestConn) header(op uint16) vsock.Header {
	return vsock.Header{
		SrcCID: c.s.cid, DstCID: vsock.HostCID,
		SrcPort: c.key.local, DstPort: c.key.peer,
		Type: vsock.TypeStream, Op: op,
		BufAlloc: c.s.bufAlloc, FwdCnt: c.fwdCnt,
	}
}

// Deliver processes one packet the device put in a guest rx buffer.
func (s *Stack) Deliver(h vsock.Header, data []byte) {
	var reply []vsock.Header
	s.mu.Lock()
	s.received[h.Op]++
	if h.SrcCID != vsock.HostCID || h.DstCID != s.cid || h.Type != vsock.TypeStream {
		s.violation("packet with bad addressing: %s", h.String())
		s.mu.Unlock()
		return
	}
	if int(h.Len) != len(data) {
		s.violation("header len %d but %d bytes of payload", h.Len, len(data))
	}
	key := stackKey{local: h.DstPort, peer: h.SrcPort}
	c := s.conns[key]
	switch {
	case c == nil && h.Op == vsock.OpRequest:
		if l := s.listeners[h.DstPort]; l != nil {
			c = s.newConn(key, true)
			c.updateCredit(&h)
			select {
			case l.backlog <- c:
				reply = append(reply, c.header(vsock.OpResponse))
			default:
				delete(s.conns, key)
				reply = append(reply, rstFor(s.cid, &h))
			}
		} else {
			reply = append(reply, rstFor(s.cid, &h))
		}
	case c == nil:
		if h.Op != vsock.OpRST {
			reply = append(reply, rstFor(s.cid, &h))
		}
	default:
		reply = c.handle(&h, data)
	}
	s.mu.Unlock()
	for _, r := range reply {
		_ = s.send(r, nil)
	}
}

func rstFor(cid uint64, h *vsock.Header) vsock.Header {
	return vsock.Header{SrcCID: cid, DstCID: vsock.HostCID, SrcPort: h.DstPort, DstPort: h.SrcPort,
		Type: vsock.TypeStream, Op: vsock.OpRST}
}

func (s *Stack) newConn(key stackKey, connected bool) *GuestConn {
	c := &GuestConn{s: s, key: key, connected: connected, wake: make(chan struct{})}
	s.conns[key] = c
	return c
}

// Dial opens a connection to host port, as connect(2) on AF_VSOCK to
// CID 2 does, and waits up to timeout for the host's answer.
func (s *Stack) Dial(port uint32, timeout time.Duration) (*GuestConn, error) {
	s.mu.Lock()
	key := stackKey{local: s.nextPort, peer: port}
	s.nextPort++
	c := s.newConn(key, false)
	req := c.header(vsock.OpRequest)
	s.mu.Unlock()
	if err := s.send(req, nil); err != nil {
		return nil, err
	}
	deadline := time.After(timeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		switch {
		case c.connected:
			return c, nil
		case c.reset:
			return nil, fmt.Errorf("guest dial of host port %d: %w", port, syscall.ECONNREFUSED)
		}
		wake := c.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-deadline:
			s.mu.Lock()
			delete(s.conns, key)
			return nil, fmt.Errorf("guest dial of host port %d: %w", port, syscall.ETIMEDOUT)
		}
		s.mu.Lock()
	}
}

// Prepare registers a connection from guest port to host port that the
// test opens itself with raw packets (Guest.SendRaw), so the stack does not
// answer the host's RESPONSE with RST.
func (s *Stack) Prepare(guestPort, hostPort uint32) *GuestConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newConn(stackKey{local: guestPort, peer: hostPort}, false)
}

// Listen accepts the host's connections to guest port.
func (s *Stack) Listen(port uint32) *GuestListener {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := &GuestListener{s: s, port: port, backlog: make(chan *GuestConn, 16)}
	s.listeners[port] = l
	return l
}

// GuestListener is a guest-side listening port.
type GuestListener struct {
	s       *Stack
	port    uint32
	backlog chan *GuestConn
}

// Accept waits up to timeout for the host to connect.
func (l *GuestListener) Accept(timeout time.Duration) (*GuestConn, error) {
	select {
	case c := <-l.backlog:
		return c, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("guest accept on port %d: %w", l.port, syscall.ETIMEDOUT)
	}
}

// GuestConn is the guest's end of one stream. Its Write never has more
// than the host's advertised free credit in flight.
type GuestConn struct {
	s   *Stack
	key stackKey

	// Guarded by s.mu.
	connected, reset bool
	wake             chan struct{}
	rx               bytes.Buffer
	fwdCnt           uint32
	lastFwdSent      uint32
	txCnt            uint32
	peerBufAlloc     uint32
	peerFwdCnt       uint32
	peerShut         uint32
	localShut        uint32
	// MaxBuffered is the most host data ever held unread (≤ bufAlloc if the
	// host honours our credit).
	maxBuffered int
}

func (c *GuestConn) signal() {
	close(c.wake)
	c.wake = make(chan struct{})
}

func (c *GuestConn) updateCredit(h *vsock.Header) {
	c.peerBufAlloc, c.peerFwdCnt = h.BufAlloc, h.FwdCnt
}

// handle processes a packet for c; called with s.mu held. It returns
// packets to send once the lock is released.
func (c *GuestConn) handle(h *vsock.Header, data []byte) []vsock.Header {
	s := c.s
	defer c.signal()
	if h.Op == vsock.OpRST {
		c.reset = true
		delete(s.conns, c.key)
		return nil
	}
	c.updateCredit(h)
	switch h.Op {
	case vsock.OpResponse:
		if c.connected {
			s.violation("RESPONSE on an open connection %v", c.key)
		}
		c.connected = true
	case vsock.OpRW:
		if !c.connected {
			s.violation("RW before RESPONSE on %v", c.key)
		}
		if c.localShut&vsock.ShutdownRcv != 0 {
			s.violation("RW after we shut down receiving on %v", c.key)
		}
		if c.rx.Len()+len(data) > int(s.bufAlloc) {
			s.violation("host overran our credit on %v: %d buffered + %d > buf_alloc %d",
				c.key, c.rx.Len(), len(data), s.bufAlloc)
		}
		c.rx.Write(data)
		c.maxBuffered = max(c.maxBuffered, c.rx.Len())
	case vsock.OpCreditRequest:
		return []vsock.Header{c.header(vsock.OpCreditUpdate)}
	case vsock.OpShutdown:
		c.peerShut |= h.Flags
		if c.peerShut == vsock.ShutdownRcv|vsock.ShutdownSend && !s.ignoreShutdown {
			// Linux answers a full shutdown with RST and closes.
			c.reset = true
			delete(s.conns, c.key)
			return []vsock.Header{c.header(vsock.OpRST)}
		}
	case vsock.OpRequest:
		s.violation("REQUEST on an existing connection %v", c.key)
	}
	return nil
}

// MaxBuffered returns the most host data this connection ever held unread.
func (c *GuestConn) MaxBuffered() int {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.maxBuffered
}

// LocalPort returns the guest's port.
func (c *GuestConn) LocalPort() uint32 { return c.key.local }

// errGuestTimeout is returned by GuestConn calls that waited too long.
var errGuestTimeout = errors.New("vsocktest: guest call timed out")

// Timeout bounds every blocking GuestConn call, so a broken device fails a
// test instead of hanging it.
const Timeout = 30 * time.Second

// Read reads host data; io.EOF once the host shut down sending (or the
// connection was reset) and the buffer is empty.
func (c *GuestConn) Read(p []byte) (int, error) {
	s := c.s
	deadline := time.After(Timeout)
	s.mu.Lock()
	for {
		if c.rx.Len() > 0 {
			n, _ := c.rx.Read(p)
			c.fwdCnt += uint32(n)
			var upd []vsock.Header
			// Like Linux: tell the host once a good part of the buffer is free.
			if !c.reset && c.fwdCnt-c.lastFwdSent >= s.bufAlloc/2 {
				c.lastFwdSent = c.fwdCnt
				upd = append(upd, c.header(vsock.OpCreditUpdate))
			}
			s.mu.Unlock()
			for _, h := range upd {
				if err := s.send(h, nil); err != nil {
					return n, err
				}
			}
			return n, nil
		}
		if c.reset || c.peerShut&vsock.ShutdownSend != 0 {
			s.mu.Unlock()
			return 0, io.EOF
		}
		wake := c.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-deadline:
			return 0, errGuestTimeout
		}
		s.mu.Lock()
	}
}

// Write sends p in RW packets of at most 64 KiB, never beyond the host's
// free credit: peer_buf_alloc − (tx_cnt − peer_fwd_cnt).
func (c *GuestConn) Write(p []byte) (int, error) {
	s := c.s
	total := 0
	deadline := time.After(Timeout)
	s.mu.Lock()
	for len(p) > 0 {
		if c.reset || c.peerShut&vsock.ShutdownRcv != 0 || c.localShut&vsock.ShutdownSend != 0 {
			s.mu.Unlock()
			return total, syscall.EPIPE
		}
		inFlight := c.txCnt - c.peerFwdCnt
		credit := 0
		if inFlight <= c.peerBufAlloc {
			credit = int(c.peerBufAlloc - inFlight)
		}
		if n := min(len(p), credit, vsock.MaxPacketData); n > 0 {
			h := c.header(vsock.OpRW)
			h.Len = uint32(n)
			c.txCnt += uint32(n)
			c.lastFwdSent = c.fwdCnt
			chunk := p[:n]
			s.mu.Unlock()
			if err := s.send(h, chunk); err != nil {
				return total, err
			}
			p = p[n:]
			total += n
			s.mu.Lock()
			continue
		}
		wake := c.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-deadline:
			return total, errGuestTimeout
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	return total, nil
}

// Shutdown sends SHUTDOWN with flags (vsock.ShutdownSend for shutdown(SHUT_WR)).
func (c *GuestConn) Shutdown(flags uint32) error {
	s := c.s
	s.mu.Lock()
	c.localShut |= flags
	h := c.header(vsock.OpShutdown)
	h.Flags = c.localShut
	s.mu.Unlock()
	return s.send(h, nil)
}

// Close shuts down both directions, as close(2) does, and waits up to
// Timeout for the host's RST.
func (c *GuestConn) Close() error {
	if err := c.Shutdown(vsock.ShutdownRcv | vsock.ShutdownSend); err != nil {
		return err
	}
	return c.WaitReset(Timeout)
}

// Reset sends RST, aborting the connection.
func (c *GuestConn) Reset() error {
	s := c.s
	s.mu.Lock()
	c.reset = true
	delete(s.conns, c.key)
	h := c.header(vsock.OpRST)
	c.signal()
	s.mu.Unlock()
	return s.send(h, nil)
}

// WaitReset waits until the host reset the connection (RST received).
func (c *GuestConn) WaitReset(timeout time.Duration) error {
	s := c.s
	deadline := time.After(timeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	for !c.reset {
		wake := c.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-deadline:
			s.mu.Lock()
			return fmt.Errorf("waiting for the host's RST: %w", errGuestTimeout)
		}
		s.mu.Lock()
	}
	return nil
}

// WaitPeerShutdown waits until the host sent SHUTDOWN with flags.
func (c *GuestConn) WaitPeerShutdown(flags uint32, timeout time.Duration) error {
	s := c.s
	deadline := time.After(timeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	for c.peerShut&flags != flags && !c.reset {
		wake := c.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-deadline:
			s.mu.Lock()
			return fmt.Errorf("waiting for the host's SHUTDOWN %#x: %w", flags, errGuestTimeout)
		}
		s.mu.Lock()
	}
	if c.peerShut&flags != flags {
		return fmt.Errorf("connection reset while waiting for SHUTDOWN %#x: %w", flags, net.ErrClosed)
	}
	return nil
}

// IsReset reports whether the connection was reset (RST sent or received).
func (c *GuestConn) IsReset() bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.reset
}
