package vsock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// Queue indices of a virtio-vsock device.
const (
	rxQueue    = 0 // device → driver packets, into guest-posted buffers
	txQueue    = 1 // driver → device packets
	eventQueue = 2 // transport events: TRANSPORT_RESET after a restore
)

// queueSize is the largest queue the device accepts per queue.
const queueSize = 256

// FeatureStream is VIRTIO_VSOCK_F_STREAM: stream sockets are supported.
const FeatureStream uint64 = 1 << 0

// txBudget bounds how many tx chains one worker round handles before
// serving rx, so a guest that keeps the tx queue full cannot starve rx.
const txBudget = 64

// Config configures a Device. Zero fields take the documented defaults.
type Config struct {
	// GuestCID is the guest's context id, ≥ 3 and < 2^32−1. Required.
	GuestCID uint64
	// BufferSize is each connection's receive buffer (buf_alloc) for data
	// from the guest. Default 256 KiB.
	BufferSize uint32
	// TxBufferSize caps data written by the host and not yet delivered to
	// the guest, per connection. Default 256 KiB.
	TxBufferSize int
	// MaxConnections caps open connections (both directions). Default 256.
	MaxConnections int
	// AcceptBacklog caps connections per listener not yet accepted. Default 64.
	AcceptBacklog int
	// MaxPendingResets caps RSTs waiting for a guest rx buffer. Default 256.
	MaxPendingResets int
	// ConnectTimeout bounds Dial when its context has no earlier deadline.
	// Default 10 s.
	ConnectTimeout time.Duration
	// CloseTimeout bounds how long a closed connection waits for the guest
	// to complete the shutdown before it is reset. Default 8 s (Linux's).
	CloseTimeout time.Duration
	// Logger receives warnings (guest-caused ones rate-limited). Default
	// slog.Default().
	Logger *slog.Logger
}

func (c *Config) applyDefaults() error {
	if c.GuestCID < 3 || c.GuestCID >= 1<<32-1 {
		return fmt.Errorf("vsock: guest CID %d is invalid: it must be at least 3 and below 4294967295 (0-2 are reserved for the hypervisor, local and host)", c.GuestCID)
	}
	if c.BufferSize == 0 {
		c.BufferSize = 256 << 10
	}
	if c.TxBufferSize <= 0 {
		c.TxBufferSize = 256 << 10
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = 256
	}
	if c.AcceptBacklog <= 0 {
		c.AcceptBacklog = 64
	}
	if c.MaxPendingResets <= 0 {
		c.MaxPendingResets = 256
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 10 * time.Second
	}
	if c.CloseTimeout <= 0 {
		c.CloseTimeout = 8 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// ErrNotActive is returned by Dial while the guest driver has not
// activated the device (or after a device reset, until it does again).
var ErrNotActive = errors.New("vsock: device not active: the guest has not started its vsock driver")

// errDeviceReset is what open connections report after a device reset.
var errDeviceReset = fmt.Errorf("vsock: device reset by the guest: %w", syscall.ECONNRESET)

// Device is a virtio-vsock device (virtio.Device) with a host-side net API:
// Listen for ports the guest dials, Dial for ports the guest listens on.
type Device struct {
	cfg  Config
	log  *ratelog.Logger // guest-caused problems, rate-limited
	m    *muxer
	kick chan struct{} // wakes the worker; capacity 1

	// life guards the worker's lifecycle (Activate/Reset).
	life sync.Mutex
	stop chan struct{}
	done chan struct{}
	// resetGuest (guarded by life) is set by RestoreDeviceState: the next
	// activation tells the guest its transport was reset.
	resetGuest bool
}

var _ virtio.Device = (*Device)(nil)

// New returns a vsock device for cfg. Listeners can be opened at once;
// packets flow once the guest activates the device.
func New(cfg Config) (*Device, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	d := &Device{cfg: cfg, log: ratelog.New(cfg.Logger, nil), kick: make(chan struct{}, 1)}
	d.m = newMuxer(cfg, d.log, d.wakeWorker)
	return d, nil
}

// GuestCID returns the guest's context id.
func (d *Device) GuestCID() uint64 { return d.cfg.GuestCID }

func (d *Device) wakeWorker() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceTypeVsock }

// Features implements virtio.Device.
func (d *Device) Features() uint64 { return FeatureStream }

// QueueMaxSizes implements virtio.Device: rx, tx and event queues.
func (d *Device) QueueMaxSizes() []uint16 { return []uint16{queueSize, queueSize, queueSize} }

// ReadConfig implements virtio.Device: the config space is guest_cid, a
// little-endian u64.
func (d *Device) ReadConfig(offset uint64, data []byte) {
	var space [8]byte
	binary.LittleEndian.PutUint64(space[:], d.cfg.GuestCID)
	if offset < uint64(len(space)) {
		copy(data, space[offset:])
	}
}

// WriteConfig implements virtio.Device; the config space is read-only.
func (d *Device) WriteConfig(offset uint64, data []byte) {}

// Activate implements virtio.Device: it starts the worker that pumps the
// rx and tx queues.
func (d *Device) Activate(mem virtio.GuestMemory, irq virtio.Interrupt, queues []*virtio.Queue, features uint64) error {
	if len(queues) != 3 || queues[rxQueue] == nil || queues[txQueue] == nil {
		return fmt.Errorf("vsock: the driver must enable the rx and tx queues (got %d queues)", len(queues))
	}
	d.life.Lock()
	defer d.life.Unlock()
	if d.stop != nil {
		return fmt.Errorf("vsock: Activate called twice without Reset")
	}
	d.stop, d.done = make(chan struct{}), make(chan struct{})
	d.m.mu.Lock()
	d.m.active = true
	d.m.mu.Unlock()
	w := &worker{d: d, irq: irq, rx: queues[rxQueue], tx: queues[txQueue], scratch: make([]byte, MaxPacketData)}
	if d.resetGuest && queues[eventQueue] != nil {
		w.event, w.resetPending = queues[eventQueue], true
	}
	d.resetGuest = false
	go w.run(d.stop, d.done)
	d.wakeWorker()
	return nil
}

// Notify implements virtio.Device: the guest posted tx packets, rx
// buffers or event buffers. It only wakes the worker.
func (d *Device) Notify(queue int) {
	d.wakeWorker() // any queue: an event buffer may carry a pending reset
}

// Reset implements virtio.Device: it stops the worker and resets every
// connection (the guest's side of them is gone). Listeners stay open.
func (d *Device) Reset() {
	d.life.Lock()
	defer d.life.Unlock()
	if d.stop != nil {
		close(d.stop)
		<-d.done
		d.stop, d.done = nil, nil
	}
	d.m.mu.Lock()
	d.m.active = false
	d.m.resetAll(errDeviceReset)
	d.m.mu.Unlock()
}

// Listen returns a listener for connections the guest opens to host port
// (CID 2). It works before the device is activated and survives resets.
func (d *Device) Listen(port uint32) (net.Listener, error) {
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.listeners[port] != nil {
		return nil, &net.OpError{Op: "listen", Net: "vsock", Addr: Addr{CID: HostCID, Port: port},
			Err: fmt.Errorf("vsock: host port %d already has a listener: %w", port, syscall.EADDRINUSE)}
	}
	l := &Listener{m: m, port: port, backlog: make(chan *Conn, d.cfg.AcceptBacklog), done: make(chan struct{})}
	m.listeners[port] = l
	return l, nil
}

// Dial connects to guestPort in the guest. It fails with ErrNotActive
// before the guest driver is up, and with ECONNREFUSED when nothing listens
// there. The context (and Config.ConnectTimeout) bounds the wait.
func (d *Device) Dial(ctx context.Context, guestPort uint32) (net.Conn, error) {
	m := d.m
	remote := Addr{CID: d.cfg.GuestCID, Port: guestPort}
	opErr := func(err error) error { return &net.OpError{Op: "dial", Net: "vsock", Addr: remote, Err: err} }

	ctx, cancel := context.WithTimeout(ctx, d.cfg.ConnectTimeout)
	defer cancel()

	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.active {
		return nil, opErr(ErrNotActive)
	}
	if len(m.conns) >= d.cfg.MaxConnections {
		return nil, opErr(fmt.Errorf("vsock: %d connections open, the configured maximum", len(m.conns)))
	}
	local, err := m.allocPort()
	if err != nil {
		return nil, opErr(err)
	}
	c := newConn(m, connKey{local: local, peer: guestPort}, stateConnecting)
	c.needRequest = true
	m.add(c)
	m.schedule(c)
	for {
		switch {
		case c.state == stateConnected, c.state == stateClosing:
			return c, nil
		case c.state == stateClosed:
			if c.established {
				return c, nil // accepted, then closed at once: reads see EOF
			}
			return nil, opErr(c.err)
		}
		wake := c.wake
		m.mu.Unlock()
		select {
		case <-wake:
			m.mu.Lock()
		case <-ctx.Done():
			m.mu.Lock()
			if c.state == stateConnecting {
				c.hostClosed = true
				c.terminate(ctx.Err(), true)
				return nil, opErr(fmt.Errorf("vsock: guest port %d did not answer: %w", guestPort, ctx.Err()))
			}
		}
	}
}

// worker pumps the queues of one activation.
type worker struct {
	d       *Device
	irq     virtio.Interrupt
	rx, tx  *virtio.Queue
	scratch []byte // one packet's payload
	// event is the event queue while resetPending: a TRANSPORT_RESET
	// waits for the guest's next event buffer.
	event        *virtio.Queue
	resetPending bool
}

func (w *worker) run(stop, done chan struct{}) {
	defer close(done)
	for {
		select {
		case <-stop:
			w.flushTx()
			return
		case <-w.d.kick:
		}
		for {
			var err error
			if w.resetPending {
				w.resetPending, err = w.sendTransportReset()
			}
			more := false
			if err == nil {
				more, err = w.processTx()
			}
			if err == nil {
				err = w.processRx()
			}
			if err != nil {
				// The guest broke a ring: stop until the transport resets us.
				w.irq.NeedsReset(err)
				<-stop
				return
			}
			if !more {
				break
			}
		}
	}
}

// flushTx handles the tx packets still queued when the device resets, so
// that what the guest sent before it reset the device reaches the host's
// connections ahead of the reset (Read returns it, then the reset's
// error): a guest agent answers the helper's shutdown and powers off at
// once, and the guest's shutdown resets the device, maybe before the
// worker woke for the answer. At most one queue's worth: the guest is
// resetting, and more is not its to send.
func (w *worker) flushTx() {
	for range queueSize/txBudget + 1 {
		if more, err := w.processTx(); !more || err != nil {
			return
		}
	}
}

// processTx handles up to txBudget guest packets and reports whether more
// may be waiting. The only error it returns is a broken queue.
func (w *worker) processTx() (more bool, err error) {
	defer func() {
		if w.tx.NeedsInterrupt() {
			w.irq.SignalUsed()
		}
	}()
	for range txBudget {
		chain, err := w.tx.Pop()
		var chainErr *virtio.ChainError
		switch {
		case errors.As(err, &chainErr):
			w.d.log.Warn("vsock: guest tx chain refused", "err", err)
			continue
		case err != nil:
			return false, fmt.Errorf("vsock: tx queue: %w", err)
		case chain == nil:
			return false, nil
		}
		if err := w.handleTxChain(chain); err != nil {
			w.d.log.Warn("vsock: dropping a bad packet from the guest", "err", err)
		}
		if err := w.tx.Push(chain, 0); err != nil {
			return false, fmt.Errorf("vsock: tx queue: %w", err)
		}
	}
	return true, nil
}

// handleTxChain parses one guest packet (header copied out once, then
// validated) and dispatches it.
func (w *worker) handleTxChain(chain *virtio.Chain) error {
	r := chain.Reader()
	var raw [HeaderSize]byte
	if _, err := io.ReadFull(r, raw[:]); err != nil {
		return fmt.Errorf("%w: chain has %d readable bytes (%v)", ErrShortHeader, chain.ReadableLen(), err)
	}
	h, _ := DecodeHeader(raw[:])
	if err := h.Validate(w.d.cfg.GuestCID); err != nil {
		return err
	}
	if r.Remaining() < h.Len {
		return fmt.Errorf("vsock: %s: len %d but the chain holds %d more bytes", h.String(), h.Len, r.Remaining())
	}
	data := w.scratch[:h.Len]
	if _, err := io.ReadFull(r, data); err != nil {
		return fmt.Errorf("vsock: reading the payload of %s: %w", h.String(), err)
	}
	m := w.d.m
	m.mu.Lock()
	m.handleGuestPacket(&h, data)
	m.mu.Unlock()
	return nil
}

// processRx fills guest rx buffers with waiting packets. The only error it
// returns is a broken queue.
func (w *worker) processRx() error {
	m := w.d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	defer func() {
		if w.rx.NeedsInterrupt() {
			w.irq.SignalUsed()
		}
	}()
	var raw [HeaderSize]byte
	for m.pruneRx() {
		chain, err := w.rx.Pop()
		var chainErr *virtio.ChainError
		switch {
		case errors.As(err, &chainErr):
			w.d.log.Warn("vsock: guest rx chain refused", "err", err)
			continue
		case err != nil:
			return fmt.Errorf("vsock: rx queue: %w", err)
		case chain == nil:
			return nil // no buffers: the guest notifies when it posts some
		}
		cw := chain.Writer()
		room := int(cw.Available())
		var p rxPacket
		ok := false
		if room >= HeaderSize {
			p, ok = m.nextRx(room - HeaderSize)
		}
		if ok {
			p.hdr.Encode(raw[:])
			_, err = cw.Write(raw[:])
			if err == nil && len(p.data1) > 0 {
				_, err = cw.Write(p.data1)
			}
			if err == nil && len(p.data2) > 0 {
				_, err = cw.Write(p.data2)
			}
		}
		written := cw.Written()
		switch {
		case !ok:
			w.d.log.Warn("vsock: guest rx buffer too small for a packet", "bytes", room)
			written = 0
		case err != nil:
			w.d.log.Warn("vsock: writing a packet into a guest rx buffer", "err", err)
			written = 0
		default:
			m.commitRx(&p)
		}
		if err := w.rx.Push(chain, written); err != nil {
			return fmt.Errorf("vsock: rx queue: %w", err)
		}
	}
	return nil
}
