package vsock

// A primer on the virtio-vsock stream protocol (virtio 1.2 §5.10), as this
// file implements it for one connection between a host port and a guest port.
//
// Packets. Every packet is a 44-byte header (packet.go) naming both ends
// (cid:port), an op, and the sender's flow-control state; RW packets carry
// len bytes of stream data after the header.
//
// Opening. The side that connects sends REQUEST; the other answers RESPONSE
// (accepted) or RST (nobody listening, backlog full, too many connections).
// The guest connects to host listeners (Device.Listen); the host connects to
// guest listeners (Device.Dial).
//
// Credit. Each side has a receive buffer of buf_alloc bytes and counts
// fwd_cnt, the bytes its reader has consumed from it; both travel in every
// header. A sender counts tx_cnt, the bytes it ever sent, and may have at
// most peer_buf_alloc − (tx_cnt − peer_fwd_cnt) bytes in flight: it never
// sends more. When the host reader frees enough of our buffer we send
// CREDIT_UPDATE; a CREDIT_REQUEST is answered with one. The counters are
// free-running uint32s, so all the arithmetic wraps. Because the guest may
// never exceed our buf_alloc, guest→host data is held in a buffer of exactly
// that size, and a guest that overruns it is reset. Host→guest data waits in
// a bounded buffer, and Write blocks until the guest grants credit.
//
// Closing. SHUTDOWN carries flags: SEND (I will send no more: the reader on
// the other side sees EOF once the buffer drains) and RCV (I will receive no
// more: writes to me fail). Flags accumulate. Conn.CloseWrite sends SEND once
// the pending data has been delivered; Conn.Close sends both and waits for
// the guest's RST, sending its own RST if none comes within CloseTimeout. A
// peer that receives SHUTDOWN with both flags answers RST, so when the guest
// closes (both flags) we answer RST and forget the connection. RST closes a
// connection at once, in any state; an RST is never answered.
//
// States of a connection:
//
//	connecting --RESPONSE--> connected --host Close--> closing --RST/timeout--> closed
//	     |                       |                                                 ^
//	     +--------RST------------+---RST, SHUTDOWN(both) from guest, violation-----+
//
// Half-closes (CloseWrite, the guest's SHUTDOWN SEND) stay in connected.
//
// Concurrency: all fields below are guarded by the muxer's mutex; the Conn's
// net.Conn methods (netconn.go) take it and wait on wake for changes.

import (
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

type connState int

const (
	stateConnecting connState = iota // host sent REQUEST, awaiting RESPONSE
	stateConnected                   // open, possibly half-closed
	stateClosing                     // host closed; SHUTDOWN(both) queued or sent, awaiting RST
	stateClosed                      // over; at most an RST left to send
)

// connKey identifies a connection: the host's port and the guest's port.
type connKey struct {
	local uint32 // host port
	peer  uint32 // guest port
}

// Conn is one vsock stream between a host port and a guest port. It is the
// net.Conn returned by Device.Dial and by a Device.Listen listener's Accept.
type Conn struct {
	m   *muxer
	key connKey

	// wmu serialises Write calls so one call's bytes stay contiguous.
	wmu sync.Mutex

	readDeadline, writeDeadline *deadline

	// Everything below is guarded by m.mu.

	state connState
	// err, once set, is what reads (after the buffer drains) and writes
	// return: the connection was refused, reset or the device reset.
	err         error
	hostClosed  bool // Close was called
	established bool // the connection was open at some point
	// wake is closed and replaced on every change a blocked call may wait
	// for (see signal).
	wake chan struct{}

	// Guest → host.
	rx          byteRing // data for the host reader; capacity = bufAlloc
	bufAlloc    uint32   // our receive buffer, advertised to the guest
	fwdCnt      uint32   // bytes the host reader consumed
	lastFwdSent uint32   // fwdCnt as of the last header we sent

	// Host → guest.
	tx              byteRing // accepted by Write, not yet in a guest buffer
	txCnt           uint32   // bytes accepted by Write (sent or pending)
	peerBufAlloc    uint32
	peerFwdCnt      uint32
	creditRequested bool // a CREDIT_REQUEST went out and the credit has not changed since

	peerShut      uint32 // SHUTDOWN flags received from the guest
	localShut     uint32 // SHUTDOWN flags the host asked for
	localShutSent uint32 // SHUTDOWN flags already sent

	// Control packets waiting for a guest rx buffer.
	needRequest, needResponse, needCreditUpdate, needCreditRequest, needRST bool
	inRxQueue                                                               bool

	closeTimer *time.Timer
}

func newConn(m *muxer, key connKey, state connState) *Conn {
	return &Conn{
		m:             m,
		key:           key,
		state:         state,
		wake:          make(chan struct{}),
		readDeadline:  newDeadline(),
		writeDeadline: newDeadline(),
		rx:            newByteRing(int(m.cfg.BufferSize)),
		bufAlloc:      m.cfg.BufferSize,
		tx:            newByteRing(m.cfg.TxBufferSize),
	}
}

// signal wakes every call blocked on c.
func (c *Conn) signal() {
	close(c.wake)
	c.wake = make(chan struct{})
}

// peerCredit is how many more bytes the guest can take right now:
// peer_buf_alloc − (tx_cnt − peer_fwd_cnt), or 0 if the guest's numbers make
// no sense (a fwd_cnt ahead of what we sent, a shrunk buffer).
func (c *Conn) peerCredit() int {
	inFlight := c.txCnt - c.peerFwdCnt
	if inFlight > c.peerBufAlloc {
		return 0
	}
	return int(c.peerBufAlloc - inFlight)
}

// updatePeerCredit records the flow-control state of a guest header. A
// new CREDIT_REQUEST may go out only once the credit changed, so a guest
// that answers each request with the same, still-full credit does not
// start a request/update ping-pong.
func (c *Conn) updatePeerCredit(h *Header) {
	if h.BufAlloc != c.peerBufAlloc || h.FwdCnt != c.peerFwdCnt {
		c.creditRequested = false
	}
	c.peerBufAlloc, c.peerFwdCnt = h.BufAlloc, h.FwdCnt
}

// creditUpdateThreshold is how many consumed bytes the guest must be told
// about before a CREDIT_UPDATE is worth a packet on its own.
func (c *Conn) creditUpdateThreshold() uint32 { return max(c.bufAlloc/4, 1) }

// consumed records that the host reader took n bytes from the rx buffer.
func (c *Conn) consumed(n int) {
	c.fwdCnt += uint32(n)
	if c.state == stateConnected && c.peerShut&ShutdownSend == 0 &&
		c.fwdCnt-c.lastFwdSent >= c.creditUpdateThreshold() {
		c.needCreditUpdate = true
		c.m.schedule(c)
	}
}

// handle processes a validated packet from the guest addressed to c.
// data is the payload of an RW packet, valid only during the call.
func (c *Conn) handle(h *Header, data []byte) {
	m := c.m
	if h.Op == OpRST {
		if c.state == stateConnecting {
			c.terminate(errRefused, false)
		} else {
			c.terminate(nil, false)
		}
		return
	}
	if c.state == stateClosed {
		return // an RST of ours is queued; ignore the rest
	}
	c.updatePeerCredit(h)
	defer c.signal() // credit, data or state changed

	if c.state == stateConnecting && h.Op != OpResponse && h.Op != OpCreditUpdate {
		// Before RESPONSE the guest may only accept (or RST) our REQUEST.
		m.log.Warn("vsock: guest sent a packet on a connection it has not accepted; resetting it",
			"conn", c.key, "op", opName(h.Op))
		c.terminate(errRefused, true)
		return
	}

	switch h.Op {
	case OpResponse:
		if c.state != stateConnecting {
			m.log.Warn("vsock: guest sent RESPONSE on an open connection; resetting it", "conn", c.key)
			c.terminate(errReset, true)
			return
		}
		c.state = stateConnected
		c.established = true
	case OpRequest:
		m.log.Warn("vsock: guest sent REQUEST on an existing connection; resetting it", "conn", c.key)
		c.terminate(errReset, true)
	case OpRW:
		if c.hostClosed || c.peerShut&ShutdownSend != 0 {
			// Nobody will read it: count it as consumed so the guest's
			// credit does not stall, and drop it.
			c.fwdCnt += uint32(len(data))
			return
		}
		if len(data) > c.rx.Free() {
			m.log.Warn("vsock: guest overran its credit; resetting the connection",
				"conn", c.key, "len", len(data), "free", c.rx.Free())
			c.terminate(fmt.Errorf("%w: guest sent beyond its credit", errReset), true)
			return
		}
		c.rx.Write(data)
	case OpCreditUpdate:
		// The credit was recorded above; blocked writers are woken by signal.
	case OpCreditRequest:
		c.needCreditUpdate = true
		m.schedule(c)
	case OpShutdown:
		c.peerShut |= h.Flags
		if c.peerShut&ShutdownRcv != 0 {
			c.tx.Reset() // the guest will not read it
		}
		if c.peerShut == shutdownBoth {
			// The guest closed: answer RST, as Linux does, and forget the
			// connection. Buffered data stays readable; then EOF.
			c.terminate(nil, true)
		}
	}
}

// terminate ends the connection. err is what host calls return once the
// buffered data is read (nil: EOF for reads, EPIPE for writes). With sendRST
// an RST is queued and the connection leaves the muxer once it is sent;
// otherwise it leaves at once.
func (c *Conn) terminate(err error, sendRST bool) {
	if c.state == stateClosed {
		return
	}
	c.state = stateClosed
	if c.err == nil {
		c.err = err
	}
	c.tx.Reset()
	c.needRequest, c.needResponse, c.needCreditUpdate, c.needCreditRequest = false, false, false, false
	if c.closeTimer != nil {
		c.closeTimer.Stop()
		c.closeTimer = nil
	}
	if sendRST {
		c.needRST = true
		c.m.schedule(c)
	} else {
		c.m.remove(c)
	}
	c.signal()
}

// hasRxWork reports whether c has a packet for the guest.
func (c *Conn) hasRxWork() bool {
	if c.needRST || c.needRequest || c.needResponse || c.needCreditUpdate || c.needCreditRequest {
		return true
	}
	if c.state != stateConnected && c.state != stateClosing {
		return false
	}
	return c.tx.Len() > 0 || (c.localShut&^c.localShutSent != 0)
}

// header returns a host→guest header for c carrying our credit.
func (c *Conn) header(op uint16) Header {
	return Header{
		SrcCID:   HostCID,
		DstCID:   c.m.cfg.GuestCID,
		SrcPort:  c.key.local,
		DstPort:  c.key.peer,
		Type:     TypeStream,
		Op:       op,
		BufAlloc: c.bufAlloc,
		FwdCnt:   c.fwdCnt,
	}
}

// nextPacket returns c's next packet for the guest, with at most maxData
// bytes of payload, without consuming it (see commitPacket).
func (c *Conn) nextPacket(maxData int) (rxPacket, bool) {
	p := rxPacket{conn: c}
	switch {
	case c.needRST:
		p.hdr = c.header(OpRST)
	case c.needRequest:
		p.hdr = c.header(OpRequest)
	case c.needResponse:
		p.hdr = c.header(OpResponse)
	case c.state == stateClosed:
		return p, false
	case c.tx.Len() > 0 && maxData > 0:
		p.hdr = c.header(OpRW)
		p.data1, p.data2 = c.tx.Peek(min(maxData, MaxPacketData))
		p.hdr.Len = uint32(len(p.data1) + len(p.data2))
	case c.needCreditUpdate:
		p.hdr = c.header(OpCreditUpdate)
	case c.needCreditRequest:
		p.hdr = c.header(OpCreditRequest)
	case c.tx.Len() == 0 && c.localShut&^c.localShutSent != 0:
		p.hdr = c.header(OpShutdown)
		p.hdr.Flags = c.localShut
	default:
		return p, false
	}
	return p, true
}

// commitPacket records that p (from nextPacket) reached the guest.
func (c *Conn) commitPacket(p *rxPacket) {
	c.lastFwdSent = p.hdr.FwdCnt
	c.needCreditUpdate = false // every header carries our credit
	switch p.hdr.Op {
	case OpRST:
		c.needRST = false
		c.m.remove(c)
	case OpRequest:
		c.needRequest = false
	case OpResponse:
		c.needResponse = false
	case OpRW:
		c.tx.Discard(int(p.hdr.Len))
		c.signal() // room in tx for blocked writers
	case OpCreditRequest:
		c.needCreditRequest = false
	case OpShutdown:
		c.localShutSent |= p.hdr.Flags
	}
}

// startClose is Conn.Close on an open connection: drop unread data, flush
// the pending writes, then SHUTDOWN(both) and wait for the guest's RST.
func (c *Conn) startClose() {
	c.rx.Reset()
	switch c.state {
	case stateConnecting:
		c.terminate(net.ErrClosed, true)
	case stateConnected:
		c.state = stateClosing
		c.localShut = shutdownBoth
		c.m.schedule(c)
		m := c.m
		c.closeTimer = time.AfterFunc(m.cfg.CloseTimeout, func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if c.state == stateClosing {
				m.log.Warn("vsock: guest did not complete the shutdown in time; resetting", "conn", c.key, "timeout", m.cfg.CloseTimeout)
				c.terminate(nil, true)
			}
		})
	}
	c.signal()
}

// Errors a Conn reports, wrapped in *net.OpError.
var (
	errRefused = fmt.Errorf("vsock: connection refused by the guest: %w", syscall.ECONNREFUSED)
	errReset   = fmt.Errorf("vsock: connection reset: %w", syscall.ECONNRESET)
)
