package p9

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// FeatureMountTag is VIRTIO_9P_MOUNT_TAG: the config space holds the tag.
const FeatureMountTag uint64 = 1 << 0

// Defaults for Options.
const (
	DefaultQueueSize   = 128
	DefaultMaxInFlight = 64
	DefaultMaxFids     = 4096
	// DefaultMaxMessageSize is the largest msize the device lets a guest
	// negotiate (Linux asks for 512 KiB on virtio by default).
	DefaultMaxMessageSize = 512 << 10
	// MaxTagLen bounds the mount tag (the config space is u16 length + tag).
	MaxTagLen = 255
)

const errMsgSize = linux.EMSGSIZE

// Options configure a Device. Tag and Attacher are required.
type Options struct {
	// Tag is the mount tag the guest names: mount -t 9p -o trans=virtio TAG.
	Tag string
	// Attacher serves the attach names (typically ExportsAttacher of a
	// *hostfs.Exports).
	Attacher p9lib.Attacher
	// Logger for guest misbehaviour (rate-limited) and lifecycle; nil =
	// slog.Default().
	Logger *slog.Logger
	// QueueSize is the request queue's maximum size (power of two).
	QueueSize uint16
	// MaxInFlight bounds the requests the server handles at once; further
	// chains wait in the ring.
	MaxInFlight int
	// MaxFids bounds the fids the guest may hold (table entries); a
	// request that would exceed it fails with ENFILE. The host descriptors
	// behind them, and behind directories a clunked fid's children keep
	// open, are bounded by the Attacher's budget (hostfs.NewExportsWithin).
	MaxFids int
	// MaxMessageSize caps the msize a guest may negotiate (Tversion's msize
	// is lowered to it), and so the memory one request can hold:
	// MaxInFlight × MaxMessageSize in all. At most 4 MiB (the server's limit).
	MaxMessageSize uint32
}

// Device is a virtio-9p device (virtio id 9) serving one 9P2000.L
// connection per activation through hugelgupf/p9. See bridge.go for how
// chains reach the server. It implements virtio.Device.
type Device struct {
	guestLog *ratelog.Logger // guest misbehaviour, rate-limited
	panics   *ratelog.Logger // the server's failures, rate-limited
	config   []byte
	opts     Options
	// bridge is the server connection. Only Reset (under mu, once the
	// worker has stopped) replaces it, when it is dead; the worker an
	// activation then starts sees the new one, and a reset's clean-up
	// keeps the bridge it started with.
	bridge *bridge

	// fids the guest holds on the server, tracked so that a reset can
	// clunk them; guarded by fidMu. msize is the negotiated message size
	// (the server's limit), guarded by the worker (single goroutine).
	fidMu sync.Mutex
	fids  map[uint32]struct{}
	msize uint32

	worker  virtio.Worker
	mu      sync.Mutex
	cleanup chan struct{} // closed when the last reset's clunks are answered
}

// New returns an inactive device.
func New(opts Options) (*Device, error) {
	if opts.Tag == "" || len(opts.Tag) > MaxTagLen {
		return nil, fmt.Errorf("virtio-9p: mount tag %q must be 1..%d bytes", opts.Tag, MaxTagLen)
	}
	if opts.Attacher == nil {
		return nil, errors.New("virtio-9p: no Attacher")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.QueueSize == 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.QueueSize&(opts.QueueSize-1) != 0 || opts.QueueSize > virtio.MaxQueueSize {
		return nil, fmt.Errorf("virtio-9p: queue size %d is not a power of two ≤ %d", opts.QueueSize, virtio.MaxQueueSize)
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	opts.MaxInFlight = min(opts.MaxInFlight, noTag) // bridge tags stay below NOTAG
	if opts.MaxFids <= 0 {
		opts.MaxFids = DefaultMaxFids
	}
	if opts.MaxMessageSize == 0 {
		opts.MaxMessageSize = DefaultMaxMessageSize
	}
	opts.MaxMessageSize = min(max(opts.MaxMessageSize, minMessageSize), maxServerMessage)
	log := opts.Logger.With("device", "virtio-9p", "tag", opts.Tag)
	d := &Device{
		guestLog: ratelog.New(log, nil),
		panics:   ratelog.New(log, nil),
		opts:     opts,
		fids:     make(map[uint32]struct{}),
		msize:    opts.MaxMessageSize,
	}
	d.config = make([]byte, 2+len(opts.Tag))
	binary.LittleEndian.PutUint16(d.config, uint16(len(opts.Tag)))
	copy(d.config[2:], opts.Tag)
	d.cleanup = make(chan struct{})
	close(d.cleanup)
	d.bridge = d.newBridge()
	return d, nil
}

// newBridge starts a server connection for the device's Attacher.
func (d *Device) newBridge() *bridge {
	return newBridge(d.opts.Attacher, d.opts.MaxInFlight, d.guestLog, d.panics)
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceType9P }

// Features implements virtio.Device.
func (d *Device) Features() uint64 { return FeatureMountTag }

// QueueMaxSizes implements virtio.Device: one request queue.
func (d *Device) QueueMaxSizes() []uint16 { return []uint16{d.opts.QueueSize} }

// ReadConfig implements virtio.Device: u16 tag length, then the tag.
func (d *Device) ReadConfig(offset uint64, data []byte) {
	if offset >= uint64(len(d.config)) {
		return
	}
	copy(data, d.config[offset:])
}

// WriteConfig implements virtio.Device: the config space is read-only.
func (d *Device) WriteConfig(uint64, []byte) {}

// Activate implements virtio.Device.
func (d *Device) Activate(_ virtio.GuestMemory, irq virtio.Interrupt, queues []*virtio.Queue, _ uint64) error {
	if len(queues) != 1 || queues[0] == nil {
		return errors.New("virtio-9p: the driver did not enable the request queue")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	cleanup := d.cleanup
	return d.worker.Start(func(wake, stop <-chan struct{}) { d.serve(queues[0], irq, wake, stop, cleanup) })
}

// Notify implements virtio.Device: it wakes the worker.
func (d *Device) Notify(int) { d.worker.Wake() }

// Reset implements virtio.Device. It stops the worker, disowns the
// requests in flight (their replies are dropped, their chains never
// touched again) and clunks, in the background, every fid the guest held;
// the next activation waits for those clunks before serving. A dead server
// connection (bridge.fail) is replaced by a new one instead: its fids went
// with it.
func (d *Device) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.worker.Stop() {
		return
	}
	d.bridge.orphanAll()

	d.fidMu.Lock()
	fids := make([]uint32, 0, len(d.fids))
	for f := range d.fids {
		fids = append(fids, f)
	}
	clear(d.fids)
	d.fidMu.Unlock()
	cleanup := make(chan struct{})
	d.cleanup = cleanup
	if d.bridge.isDead() {
		d.bridge = d.newBridge()
		close(cleanup)
		return
	}
	b := d.bridge
	go func() {
		defer close(cleanup)
		for _, fid := range fids {
			b.sendInternal(tclunk(0, fid))
		}
	}()
}

// Close resets the device and waits for its clean-up. The server's
// goroutines stay parked (see bridge.go); the Attacher's files are closed.
func (d *Device) Close() {
	d.Reset()
	d.mu.Lock()
	cleanup := d.cleanup
	d.mu.Unlock()
	<-cleanup
}

func (d *Device) serve(q *virtio.Queue, irq virtio.Interrupt, wake, stop, cleanup <-chan struct{}) {
	select {
	case <-cleanup:
	case <-stop:
		return
	}
	for {
		if !d.drain(q, irq, stop) {
			return
		}
		select {
		case <-wake:
		case <-stop:
			return
		}
	}
}

// drain serves every available chain; false means stop (queue broken or
// reset).
func (d *Device) drain(q *virtio.Queue, irq virtio.Interrupt, stop <-chan struct{}) bool {
	for {
		chain, err := q.Pop()
		var chainErr *virtio.ChainError
		switch {
		case errors.As(err, &chainErr):
			d.guestLog.Warn("virtio-9p: refused a request chain", "err", err)
			if q.NeedsInterrupt() {
				irq.SignalUsed()
			}
			continue
		case err != nil:
			irq.NeedsReset(err)
			return false
		case chain == nil:
			if d.bridge.isDead() {
				// Every chain the guest queued is answered (EIO).
				irq.NeedsReset(errServerDead)
				return false
			}
			return true
		}
		if !d.handle(q, irq, chain, stop) {
			return false
		}
	}
}

// errServerDead is why the device needs a reset after its server
// connection died (bridge.fail).
var errServerDead = errors.New("virtio-9p: the 9P server connection died")

// complete finishes a chain the device answers itself.
func (d *Device) complete(q *virtio.Queue, irq virtio.Interrupt, chain *virtio.Chain, reply []byte) bool {
	if err := completeChain(q, irq, chain, reply); err != nil {
		irq.NeedsReset(fmt.Errorf("virtio-9p: completing a request: %w", err))
		return false
	}
	return true
}

// completeChain writes reply into chain when it fits (else nothing: a
// used length of 0) and completes the chain.
func completeChain(q *virtio.Queue, irq virtio.Interrupt, chain *virtio.Chain, reply []byte) error {
	var n int
	if reply != nil && uint32(len(reply)) <= chain.WritableLen() {
		n, _ = chain.Writer().Write(reply)
	}
	return q.Complete(chain, uint32(n), irq)
}

// tmessage is one T-message read from a chain and checked.
type tmessage struct {
	h   header
	msg []byte  // header and body; for a streamed Twrite, its fixed part only
	buf *[]byte // msg's pooled buffer, or nil; nil once the bridge owns it
	// streamed is how many bytes of a large Twrite's data stay in the chain
	// for the feeder to stream (see bridge.go).
	streamed uint32
	// offered is the msize a Tversion offers the server (msg is not ours
	// after submit).
	offered uint32
}

func (m *tmessage) body() []byte { return m.msg[headerSize:] }

// handle validates one chain's T-message and answers it or passes it on.
func (d *Device) handle(q *virtio.Queue, irq virtio.Interrupt, chain *virtio.Chain, stop <-chan struct{}) bool {
	m, reply, ok := d.readMessage(chain)
	// A large message is in a pooled buffer, which the bridge recycles
	// once the server has read it; otherwise it goes back here.
	defer func() { d.bridge.buffers.put(m.buf) }()
	if !ok {
		return d.complete(q, irq, chain, reply)
	}
	if reply, answered := d.intercept(&m); answered {
		return d.complete(q, irq, chain, reply)
	}
	if errno := d.trackFids(m.h.typ, m.body()); errno != 0 {
		return d.complete(q, irq, chain, rlerror(m.h.tag, errno))
	}
	return d.forward(q, irq, chain, &m, stop)
}

// readMessage reads chain's T-message and checks it against its buffers,
// the negotiated msize and the layout the server will decode. When it
// fails (ok false), reply is the answer: an Rlerror, or nil for a chain
// too small to hold one.
func (d *Device) readMessage(chain *virtio.Chain) (m tmessage, reply []byte, ok bool) {
	if chain.ReadableLen() < headerSize || chain.WritableLen() < rlerrorSize {
		d.guestLog.Warn("virtio-9p: request chain too small for a 9P message and its reply",
			"readable", chain.ReadableLen(), "writable", chain.WritableLen())
		return m, nil, false
	}
	var hb [headerSize]byte
	if _, err := io.ReadFull(chain.Reader(), hb[:]); err != nil {
		d.guestLog.Warn("virtio-9p: cannot read a 9P header", "err", err)
		return m, nil, false
	}
	h := parseHeader(hb[:])
	if h.size < headerSize || h.size > chain.ReadableLen() {
		d.guestLog.Warn("virtio-9p: 9P message size disagrees with its buffers", "size", h.size, "readable", chain.ReadableLen())
		return m, rlerror(h.tag, linux.EINVAL), false
	}
	if h.size > d.msize {
		d.guestLog.Warn("virtio-9p: 9P message larger than the negotiated msize", "size", h.size, "msize", d.msize)
		return m, rlerror(h.tag, errMsgSize), false
	}
	m.h = h
	// A large Twrite's data stays in the chain: only its first bytes are
	// read and checked here; the feeder streams the rest (see bridge.go).
	readLen := h.size
	if h.typ == msgTwrite && h.size >= pooledMessageMin {
		readLen = headerSize + twriteFixedSize
		m.streamed = h.size - readLen
	}
	if m.buf = d.bridge.buffers.get(readLen, d.msize); m.buf != nil {
		m.msg = *m.buf
	} else {
		m.msg = make([]byte, readLen)
	}
	copy(m.msg, hb[:])
	if _, err := io.ReadFull(chain.Reader(), m.msg[headerSize:]); err != nil {
		d.guestLog.Warn("virtio-9p: cannot read a 9P message", "err", err)
		return m, rlerror(h.tag, linux.EIO), false
	}
	if errno := d.checkMessage(&m); errno != 0 {
		return m, rlerror(h.tag, errno), false
	}
	return m, nil, true
}

// checkMessage checks m's body: what checkBody checks, or for a streamed
// Twrite that its count covers the data left in the chain exactly.
func (d *Device) checkMessage(m *tmessage) linux.Errno {
	body := m.body()
	if m.streamed > 0 {
		if count := u32(body, twriteFixedSize-4); count != m.streamed {
			d.guestLog.Warn("virtio-9p: malformed 9P message", "err", fmt.Errorf("%w: Twrite count %d but %d data bytes", errMalformed, count, m.streamed))
			return linux.EINVAL
		}
		return 0
	}
	if err := checkBody(m.h.typ, body); err != nil {
		var errno linux.Errno
		if !errors.As(err, &errno) {
			d.guestLog.Warn("virtio-9p: malformed 9P message", "err", err)
			errno = linux.EINVAL
		}
		return errno
	}
	return 0
}

// intercept answers the messages the device answers itself (see the
// package doc), and lowers to the device's limits what the server would
// take as it is: Treaddir's count, Tversion's msize.
func (d *Device) intercept(m *tmessage) (reply []byte, answered bool) {
	body := m.body()
	switch m.h.typ {
	case msgTxattrwalk:
		if xattrwalkName(body) != "" {
			return rlerror(m.h.tag, linux.ENODATA), true
		}
		return rlerror(m.h.tag, linux.EOPNOTSUPP), true
	case msgTxattrcreate:
		return rlerror(m.h.tag, linux.EOPNOTSUPP), true
	case msgTgetlock:
		return rgetlockNoConflict(m.h.tag, body), true
	case msgTreaddir:
		// The server builds a reply of up to count bytes whatever msize
		// says (hugelgupf/p9 v0.3.0 passes count through): clamp it to
		// what an Rreaddir within the negotiated msize can carry.
		if limit := max(d.msize, rreaddirHeaderSize) - rreaddirHeaderSize; u32(body, treaddirCountOffset) > limit {
			binary.LittleEndian.PutUint32(body[treaddirCountOffset:], limit)
		}
	case msgTversion:
		requested := u32(body, 0)
		if requested < minMessageSize {
			// The server would adopt it and then refuse every message,
			// Tversion included: the guest could never recover.
			return rlerror(m.h.tag, linux.EINVAL), true
		}
		m.offered = min(requested, d.opts.MaxMessageSize)
		binary.LittleEndian.PutUint32(body[0:4], m.offered)
	}
	return nil, false
}

// forward passes m to the server under a bridge tag; the bridge completes
// the chain with the reply. Once the server is dead, the chain is answered
// with EIO instead.
func (d *Device) forward(q *virtio.Queue, irq virtio.Interrupt, chain *virtio.Chain, m *tmessage, stop <-chan struct{}) bool {
	var tag uint16
	select {
	case tag = <-d.bridge.freeTags:
	case <-stop:
		// Reset while waiting for a slot: the chain is abandoned with
		// the rest of the queue's state.
		return false
	case <-d.bridge.dead:
		return d.complete(q, irq, chain, rlerror(m.h.tag, linux.EIO))
	}
	body := m.body()
	if m.h.typ == msgTflush {
		binary.LittleEndian.PutUint16(body[0:2], d.bridge.bridgeTagFor(binary.LittleEndian.Uint16(body[0:2])))
	}
	p := &pending{guestTag: m.h.tag, queue: q, chain: chain, irq: irq, done: make(chan struct{})}
	if m.h.typ == msgTversion {
		p.capture = make([]byte, 0, 64)
	}
	if m.streamed > 0 {
		p.data, p.dataLeft = chain.Reader(), m.streamed
	}
	if !d.bridge.submit(tag, m.msg, m.buf, p) {
		return d.complete(q, irq, chain, rlerror(m.h.tag, linux.EIO))
	}
	m.buf = nil // the bridge owns it now
	if m.h.typ == msgTversion {
		// Tversion is a barrier: learn the server's new limit before
		// passing on anything that depends on it.
		select {
		case <-p.done:
			if !d.bridge.isDead() { // else fail released p, and the demux may still write capture
				d.noteVersion(m.offered, p.capture)
			}
		case <-stop:
			return false
		}
	}
	return true
}

// noteVersion records the msize the server adopted, given the msize the
// device offered it.
func (d *Device) noteVersion(offered uint32, reply []byte) {
	// Rversion: header, msize[4], version[s]; msize 0 / "unknown" = refused.
	if len(reply) < headerSize+4 || reply[4] != msgRversion {
		return
	}
	m := u32(reply, headerSize)
	if m == 0 {
		return
	}
	if m < minMessageSize {
		d.guestLog.Warn("virtio-9p: guest negotiated a tiny msize", "msize", m)
	}
	d.msize = min(m, maxServerMessage, offered)
}

// trackFids records the fids a request creates and forgets the ones it
// releases; it refuses (ENFILE) a new fid beyond MaxFids.
func (d *Device) trackFids(typ uint8, body []byte) linux.Errno {
	d.fidMu.Lock()
	defer d.fidMu.Unlock()
	switch typ {
	case msgTattach:
		return d.addFid(u32(body, 0))
	case msgTwalk, msgTwalkgetattr:
		if newFid := u32(body, 4); newFid != u32(body, 0) {
			return d.addFid(newFid)
		}
	case msgTclunk, msgTremove:
		delete(d.fids, u32(body, 0)) // released whatever the outcome
	}
	return 0
}

func (d *Device) addFid(fid uint32) linux.Errno {
	if fid == noFid {
		return linux.EINVAL
	}
	if _, ok := d.fids[fid]; !ok && len(d.fids) >= d.opts.MaxFids {
		d.guestLog.Warn("virtio-9p: guest holds too many fids", "limit", d.opts.MaxFids)
		return linux.ENFILE
	}
	d.fids[fid] = struct{}{}
	return 0
}

var _ virtio.Device = (*Device)(nil)
