package vsock

import (
	"fmt"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// muxer routes packets between the device's queues and connections: guest
// packets go to the connection (host port, guest port) or open one on a
// listener; connections with something for the guest wait in a FIFO that
// the rx pump serves round-robin. It caps the number of connections and the
// backlog of RSTs for packets that matched no connection.
type muxer struct {
	cfg  Config
	log  *ratelog.Logger // guest-caused problems, rate-limited (the device's)
	kick func()          // wakes the device worker; safe under mu, never blocks

	mu        sync.Mutex
	active    bool // between Activate and Reset: packets can flow
	conns     map[connKey]*Conn
	listeners map[uint32]*Listener
	// localPorts counts connections per host port, so Dial never picks a
	// port in use.
	localPorts map[uint32]int
	nextPort   uint32
	// rxq holds connections with packets for the guest (Conn.inRxQueue).
	rxq []*Conn
	// resets are RSTs for guest packets that matched no connection; when
	// full, more are dropped (the guest's connect times out instead).
	resets []Header
}

// Ephemeral host ports for Dial are taken from [firstEphemeralPort,
// lastEphemeralPort], above anything a service listens on.
const (
	firstEphemeralPort = 1 << 30
	lastEphemeralPort  = 1<<31 - 1
)

func newMuxer(cfg Config, log *ratelog.Logger, kick func()) *muxer {
	return &muxer{
		cfg:        cfg,
		log:        log,
		kick:       kick,
		conns:      make(map[connKey]*Conn),
		listeners:  make(map[uint32]*Listener),
		localPorts: make(map[uint32]int),
		nextPort:   firstEphemeralPort,
	}
}

// rxPacket is one packet on its way to a guest rx buffer.
type rxPacket struct {
	hdr          Header
	data1, data2 []byte // payload (OpRW), in up to two pieces
	conn         *Conn  // nil for an RST from the resets backlog
}

// schedule queues c for the rx pump if it is not queued already.
func (m *muxer) schedule(c *Conn) {
	if !c.inRxQueue {
		c.inRxQueue = true
		m.rxq = append(m.rxq, c)
	}
	m.kick()
}

// add registers a new connection.
func (m *muxer) add(c *Conn) {
	m.conns[c.key] = c
	m.localPorts[c.key.local]++
}

// remove forgets c; packets for it will be answered with RST.
func (m *muxer) remove(c *Conn) {
	if m.conns[c.key] != c {
		return
	}
	delete(m.conns, c.key)
	if m.localPorts[c.key.local]--; m.localPorts[c.key.local] <= 0 {
		delete(m.localPorts, c.key.local)
	}
}

// handleGuestPacket dispatches a validated guest packet. data is the
// payload of an RW packet, valid only during the call.
func (m *muxer) handleGuestPacket(h *Header, data []byte) {
	key := connKey{local: h.DstPort, peer: h.SrcPort}
	if c := m.conns[key]; c != nil {
		c.handle(h, data)
		return
	}
	switch h.Op {
	case OpRST:
		return // never answer an RST
	case OpRequest:
		if m.accept(key, h) {
			return
		}
	}
	m.queueReset(h)
}

// accept opens a connection for a guest REQUEST, if a listener wants it.
func (m *muxer) accept(key connKey, h *Header) bool {
	l := m.listeners[key.local]
	if l == nil {
		return false
	}
	if len(m.conns) >= m.cfg.MaxConnections {
		m.log.Warn("vsock: connection limit reached; refusing the guest's connection",
			"port", key.local, "limit", m.cfg.MaxConnections)
		return false
	}
	c := newConn(m, key, stateConnected)
	c.established = true
	c.updatePeerCredit(h)
	select {
	case l.backlog <- c:
	default:
		m.log.Warn("vsock: listener backlog full; refusing the guest's connection",
			"port", key.local, "backlog", m.cfg.AcceptBacklog)
		return false
	}
	m.add(c)
	c.needResponse = true
	m.schedule(c)
	return true
}

// queueReset queues an RST answering h, a packet for no connection.
func (m *muxer) queueReset(h *Header) {
	if len(m.resets) >= m.cfg.MaxPendingResets {
		m.log.Warn("vsock: RST backlog full; dropping an RST", "to_port", h.SrcPort)
		return
	}
	m.resets = append(m.resets, Header{
		SrcCID:  HostCID,
		DstCID:  m.cfg.GuestCID,
		SrcPort: h.DstPort,
		DstPort: h.SrcPort,
		Type:    TypeStream,
		Op:      OpRST,
	})
	m.kick()
}

// hasRxWork reports whether a packet may be waiting for a guest rx buffer.
func (m *muxer) hasRxWork() bool { return len(m.resets) > 0 || len(m.rxq) > 0 }

// pruneRx drops queued connections with nothing left to send and reports
// whether a packet is waiting for a guest rx buffer.
func (m *muxer) pruneRx() bool {
	for len(m.rxq) > 0 && !m.rxq[0].hasRxWork() {
		m.rxq[0].inRxQueue = false
		m.rxq[0] = nil
		m.rxq = m.rxq[1:]
	}
	return m.hasRxWork()
}

// nextRx returns the next packet for the guest, with at most maxData bytes
// of payload, without consuming it; commitRx consumes it once it was
// written. Between the two, m.mu must stay held.
func (m *muxer) nextRx(maxData int) (rxPacket, bool) {
	if len(m.resets) > 0 {
		return rxPacket{hdr: m.resets[0]}, true
	}
	for len(m.rxq) > 0 {
		c := m.rxq[0]
		if p, ok := c.nextPacket(maxData); ok {
			return p, true
		}
		if maxData == 0 && c.hasRxWork() {
			// Only data is left and this buffer has no room for any: let
			// the caller retire the buffer without losing the work.
			return rxPacket{}, false
		}
		c.inRxQueue = false
		m.rxq[0] = nil
		m.rxq = m.rxq[1:]
	}
	return rxPacket{}, false
}

// commitRx consumes p, returned by the last nextRx.
func (m *muxer) commitRx(p *rxPacket) {
	if p.conn == nil {
		m.resets[0] = Header{}
		m.resets = m.resets[1:]
		return
	}
	c := p.conn
	c.commitPacket(p)
	// Round-robin: move c to the back if it has more to send.
	m.rxq[0] = nil
	m.rxq = m.rxq[1:]
	if c.hasRxWork() {
		m.rxq = append(m.rxq, c)
	} else {
		c.inRxQueue = false
	}
}

// allocPort picks a free host port for Dial.
func (m *muxer) allocPort() (uint32, error) {
	for range lastEphemeralPort - firstEphemeralPort + 1 {
		p := m.nextPort
		if m.nextPort++; m.nextPort > lastEphemeralPort {
			m.nextPort = firstEphemeralPort
		}
		if m.localPorts[p] == 0 && m.listeners[p] == nil {
			return p, nil
		}
	}
	return 0, fmt.Errorf("vsock: no free host port for an outgoing connection")
}

// resetAll ends every connection, as a device reset does: the guest's side
// of them is gone, so no RST is sent.
func (m *muxer) resetAll(err error) {
	for _, c := range m.conns {
		c.needRST = false
		c.terminate(err, false)
	}
	for _, l := range m.listeners {
		l.drainBacklog(err)
	}
	clear(m.conns)
	clear(m.localPorts)
	m.rxq = nil
	m.resets = nil
}
