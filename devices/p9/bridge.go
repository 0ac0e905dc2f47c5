package p9

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// The bridge between descriptor chains and hugelgupf/p9's server, which
// only serves a byte stream (Server.Handle(reader, writer)).
//
//   - Requests: the device validates each chain's T-message, rewrites its
//     tag to a bridge tag (unique among messages in flight, so a guest that
//     reuses a tag cannot make the server drop a request) and queues the
//     bytes on the feeder, the server's reader.
//   - Replies: the server writes R-messages to the demux, one message at a
//     time (its send mutex); the demux reads the header, finds the pending
//     request by bridge tag, restores the guest's tag and streams the
//     message straight into that chain's writable buffers, then completes
//     the chain.
//   - Concurrency: a bridge tag is a slot; there are maxInFlight of them,
//     so the server never has more requests than that in flight.
//   - Failure: a panic in a file operation is EIO for that request (guard.go).
//     When the server connection dies instead — its goroutine panics or
//     returns, the feeder or the demux panics, or a file operation ends its
//     goroutine — fail answers every request in flight with EIO and marks
//     the device DEVICE_NEEDS_RESET; the worker answers the chains still
//     queued with EIO too, and the next activation gets a new bridge.
//
// The server connection lives as long as the device: at reset the device
// clunks every fid the guest held (tracked from the requests), instead of
// ending the stream — hugelgupf/p9 v0.3.0 races when a connection ends
// (connState.stop waits on a WaitGroup that a receive goroutine it just
// spawned may still Add to, which panics). For the same reason Close parks
// the server's goroutines instead of ending the stream.
//
// Copies: the server copies whatever the feeder gives it into its own
// buffers (recv in hugelgupf/p9 v0.3.0 reads a Twrite's data into a fresh
// payload slice), so nothing retains the feeder's bytes once Read returns.
//   - A large Twrite is not copied by the device at all: the device copies
//     and checks its first bytes (header, fid, offset, count) and the
//     feeder then reads the data straight from the chain's guest buffers
//     into the server's payload slice. At reset, orphanAll copies out what
//     the server has not read yet, so that guest memory is never read after
//     Reset returns.
//   - Any other large request is read into a recycled buffer
//     (bufferPool), returned to the pool once the feeder has handed its last
//     byte to the server.

// pending is one request handed to the server.
type pending struct {
	guestTag uint16
	queue    *virtio.Queue
	chain    *virtio.Chain // nil for the device's own requests (clunks)
	irq      virtio.Interrupt
	done     chan struct{} // closed when the reply has been handled
	capture  []byte        // the reply's first bytes (for Rversion), when set

	mu sync.Mutex // guards the fields below and writes to chain
	// orphaned: the device was reset, or the server died and fail
	// answered the chain: drop the reply, never touch the chain again.
	orphaned bool
	failed   bool // the chain could not take the reply

	// The rest of a streamed Twrite (see above): dataLeft bytes the feeder
	// still reads from data, the chain's reader or, after a reset, a copy.
	data     io.Reader
	dataLeft uint32
	// dataFailed: guest memory failed mid-data; the server got zeros
	// instead and the guest gets EIO instead of the server's reply.
	dataFailed bool
}

// readData fills buf with the next bytes of a streamed Twrite's data (at
// most what remains) for the server, and reports whether more remain. Bytes guest memory
// cannot supply are sent as zeros: the message must keep its length.
func (p *pending) readData(buf []byte) (n int, more bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	buf = buf[:min(uint64(len(buf)), uint64(p.dataLeft))]
	n, err := io.ReadFull(p.data, buf)
	if err != nil {
		clear(buf[n:])
		p.dataFailed = true
	}
	p.dataLeft -= uint32(len(buf))
	if p.dataLeft == 0 {
		p.data = nil
	}
	return len(buf), p.dataLeft > 0
}

// detachData copies the data the server has not read yet out of guest
// memory, so that the chain is never read after a reset. Called with mu.
func (p *pending) detachData() {
	if p.dataLeft == 0 || p.data == nil {
		return
	}
	rest := make([]byte, p.dataLeft)
	if _, err := io.ReadFull(p.data, rest); err != nil {
		p.dataFailed = true // the rest stays zero
	}
	p.data = bytes.NewReader(rest)
}

// failWith answers p's chain with EIO (with nothing when part of a reply
// is already in it) and marks its device DEVICE_NEEDS_RESET, unless a reset
// disowned the chain; then it releases p's waiter. The bridge has already
// forgotten p (fail).
func (p *pending) failWith(cause error) {
	p.mu.Lock()
	if p.chain != nil && !p.orphaned {
		var reply []byte
		if p.chain.Writer().Written() == 0 {
			reply = rlerror(p.guestTag, linux.EIO)
		}
		if err := completeChain(p.queue, p.irq, p.chain, reply); err != nil {
			cause = fmt.Errorf("%w; completing a request: %w", cause, err)
		}
		p.irq.NeedsReset(cause)
	}
	p.orphaned = true
	p.detachData()
	p.mu.Unlock()
	close(p.done)
}

// bridge owns the server connection and the tags in flight.
type bridge struct {
	guestLog *ratelog.Logger // guest misbehaviour, rate-limited
	panics   *ratelog.Logger // the server's failures, rate-limited
	guard    *guard

	// dead is closed by fail: the server connection is gone.
	dead     chan struct{}
	failOnce sync.Once

	feed     chan request // messages for the server, in order
	freeTags chan uint16
	buffers  bufferPool

	mu      sync.Mutex
	pending map[uint16]*pending // by bridge tag
	byGuest map[uint16]uint16   // guest tag → bridge tag (current generation)

	demux demux
}

// errServerStopped is why a bridge fails when the server's Handle returns.
var errServerStopped = errors.New("virtio-9p: the 9P server stopped serving")

// newBridge starts a server for attacher, at most maxInFlight requests in
// flight. panics logs the server's failures (its own budget: a guest's
// flood of bad messages must not hide them).
func newBridge(attacher p9lib.Attacher, maxInFlight int, guestLog, panics *ratelog.Logger) *bridge {
	b := &bridge{
		guestLog: guestLog,
		panics:   panics,
		dead:     make(chan struct{}),
		feed:     make(chan request, maxInFlight),
		freeTags: make(chan uint16, maxInFlight),
		pending:  make(map[uint16]*pending),
		byGuest:  make(map[uint16]uint16),
	}
	for t := range maxInFlight {
		b.freeTags <- uint16(t)
	}
	b.demux.b = b
	b.guard = newGuard(panics, b.fail)
	srv := p9lib.NewServer(guardedAttacher{a: attacher, g: b.guard}, p9lib.WithServerLogger(serverLog{panics}))
	go func() {
		cause := errServerStopped
		defer func() {
			if r := recover(); r != nil {
				cause = fmt.Errorf("virtio-9p: the 9P server panicked: %v", r)
				panics.Error("virtio-9p: 9P server stopped", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			}
			b.fail(cause)
		}()
		_ = srv.Handle(&feeder{b: b, ch: b.feed, buffers: &b.buffers}, &b.demux)
	}()
	return b
}

// isDead reports whether fail was called.
func (b *bridge) isDead() bool {
	select {
	case <-b.dead:
		return true
	default:
		return false
	}
}

// fail declares the server connection dead (cause says why): every request
// in flight is answered with EIO and its device marked DEVICE_NEEDS_RESET,
// later submits are refused, the server's goroutines are parked (the feeder
// hands them nothing more, the demux drops what they write) and the files
// they hold are closed. The server connection cannot be ended (see above);
// Device.Reset starts a new bridge instead. Safe to call more than once.
func (b *bridge) fail(cause error) {
	b.failOnce.Do(func() {
		b.panics.Error("virtio-9p: the 9P server connection died; failing its requests with EIO", "err", cause)
		b.mu.Lock()
		close(b.dead)
		all := make([]*pending, 0, len(b.pending))
		for _, p := range b.pending {
			all = append(all, p)
		}
		clear(b.pending)
		clear(b.byGuest)
		b.mu.Unlock()
		b.guard.closeAll()
		for _, p := range all {
			p.failWith(cause)
		}
	})
}

// serving runs fn, part of serving the byte stream on one of the server's
// goroutines (what), and reports whether fn panicked. A panic, or fn ending
// its goroutine (which is then parked instead), kills the server
// connection (fail): nothing after it in the stream can be trusted.
func (b *bridge) serving(what string, fn func()) (panicked bool) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			b.panics.Error("virtio-9p: the device panicked "+what, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			b.fail(fmt.Errorf("virtio-9p: panic %s: %v", what, r))
			panicked = true
			return
		}
		b.fail(fmt.Errorf("%w (%s)", errServerGoroutineExited, what))
		park() // ending, the goroutine would run the server's racy clean-up
	}()
	fn()
	returned = true
	return false
}

// park blocks the calling server goroutine for good: the server's stream
// cannot be ended safely (see above).
func park() { select {} }

// request is one message queued for the server.
type request struct {
	msg []byte
	// buf, when set, is the pooled buffer behind msg: the feeder returns
	// it to the pool after the server has read msg's last byte.
	buf *[]byte
	// data, when set, supplies the message's bytes after msg (a streamed
	// Twrite's data).
	data *pending
}

// submit hands one message (its tag field is overwritten) to the server
// under bridge tag, registering p to receive the reply, and reports true.
// buf is msg's pooled buffer or nil; either way the caller must not touch
// msg again. When p.dataLeft > 0, the message goes on with that many bytes
// of p.data. Once the server is dead it takes nothing and reports false.
func (b *bridge) submit(tag uint16, msg []byte, buf *[]byte, p *pending) bool {
	binary.LittleEndian.PutUint16(msg[5:7], tag)
	req := request{msg: msg, buf: buf}
	if p.dataLeft > 0 {
		req.data = p
	}
	b.mu.Lock()
	if b.isDead() {
		b.mu.Unlock()
		return false
	}
	b.pending[tag] = p
	if p.chain != nil {
		b.byGuest[p.guestTag] = tag
	}
	b.mu.Unlock()
	b.feed <- req // never blocks: at most maxInFlight tags exist
	return true
}

// sendInternal sends a request of the device's own and waits for the
// reply, which is dropped; it gives up once the server is dead.
func (b *bridge) sendInternal(msg []byte) {
	var tag uint16
	select {
	case tag = <-b.freeTags:
	case <-b.dead:
		return
	}
	p := &pending{done: make(chan struct{})}
	if b.submit(tag, msg, nil, p) {
		<-p.done // closed by finish or by fail
	}
}

// bridgeTagFor maps a guest tag (Tflush's oldtag) to the bridge tag of a
// request in flight, or NOTAG (which the server treats as finished).
func (b *bridge) bridgeTagFor(guestTag uint16) uint16 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.byGuest[guestTag]; ok {
		return t
	}
	return noTag
}

// orphanAll marks every request in flight as belonging to a reset device:
// their replies are dropped, their chains never touched again. When it
// returns, no reply is being written into guest memory and no request is
// being read from it.
func (b *bridge) orphanAll() {
	b.mu.Lock()
	all := make([]*pending, 0, len(b.pending))
	for _, p := range b.pending {
		all = append(all, p)
	}
	clear(b.byGuest)
	b.mu.Unlock()
	for _, p := range all {
		p.mu.Lock()
		p.orphaned = true
		p.detachData()
		p.mu.Unlock()
	}
}

// finish retires a bridge tag after its reply, unless fail took p.
func (b *bridge) finish(tag uint16, p *pending) {
	b.mu.Lock()
	if b.pending[tag] != p {
		b.mu.Unlock()
		return
	}
	delete(b.pending, tag)
	if t, ok := b.byGuest[p.guestTag]; ok && t == tag {
		delete(b.byGuest, p.guestTag)
	}
	b.mu.Unlock()
	close(p.done)
	b.freeTags <- tag
}

func (b *bridge) lookup(tag uint16) *pending {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending[tag]
}

// feeder is the server's reader: the queued messages, back to back. The
// server reads with one goroutine at a time (its receive mutex). It never
// reports end of stream (see above): once the server is dead, it parks the
// goroutine that reads.
type feeder struct {
	b       *bridge
	mu      sync.Mutex
	ch      chan request
	buffers *bufferPool
	cur     request // the rest of the message being read
}

func (f *feeder) Read(p []byte) (n int, err error) {
	if f.b.serving("reading a request for the server", func() { n = f.read(p) }) {
		park()
	}
	return n, nil
}

// read fills p with the next bytes of the stream, waiting for a message
// when none is left; it parks the goroutine once the server is dead.
func (f *feeder) read(p []byte) int {
	if len(p) == 0 {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		switch {
		case len(f.cur.msg) > 0:
			n := copy(p, f.cur.msg)
			f.cur.msg = f.cur.msg[n:]
			if len(f.cur.msg) == 0 {
				// The server holds its own copy of every byte: recycle.
				f.buffers.put(f.cur.buf)
				f.cur.buf = nil
			}
			return n
		case f.cur.data != nil:
			n, more := f.cur.data.readData(p)
			if !more {
				f.cur.data = nil
			}
			if n > 0 {
				return n
			}
		default:
			select {
			case f.cur = <-f.ch:
			case <-f.b.dead:
				park() // hand a dead server nothing more
			}
		}
	}
}

func (f *feeder) Close() error { return nil }

// pooledMessageMin is the smallest request read into a pooled buffer;
// smaller ones are cheap to allocate and would pin a whole msize buffer.
const pooledMessageMin = 8 << 10

// bufferPool recycles request buffers of at least pooledMessageMin bytes.
// A sync.Pool rather than a fixed free list, so that an idle device gives
// the memory back; in flight there are at most maxInFlight of them.
type bufferPool struct {
	pool sync.Pool // of *[]byte
}

// get returns a buffer of len size, or nil when size is below
// pooledMessageMin. A new buffer gets capacity (the negotiated msize, so
// that it fits any later request) when that is larger than size.
func (bp *bufferPool) get(size, capacity uint32) *[]byte {
	if size < pooledMessageMin {
		return nil
	}
	if b, ok := bp.pool.Get().(*[]byte); ok && uint32(cap(*b)) >= size {
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size, max(size, capacity))
	return &b
}

// put recycles b; nil is ignored.
func (bp *bufferPool) put(b *[]byte) {
	if b != nil {
		bp.pool.Put(b)
	}
}

// demux is the server's writer. The server writes each R-message whole,
// under its send mutex, in one or more Write calls.
type demux struct {
	b *bridge

	hdr       [headerSize]byte
	hdrN      int
	remaining uint32
	tag       uint16
	cur       *pending
	written   uint32 // bytes written into the current chain
}

// Write takes the next bytes of the server's replies. Once the server is
// dead it drops them.
func (d *demux) Write(p []byte) (int, error) {
	if !d.b.isDead() {
		d.b.serving("handling a reply of the server", func() { d.write(p) })
	}
	return len(p), nil
}

func (d *demux) write(p []byte) {
	for len(p) > 0 {
		if d.hdrN < headerSize {
			n := copy(d.hdr[d.hdrN:], p)
			d.hdrN += n
			p = p[n:]
			if d.hdrN == headerSize {
				d.begin()
			}
			continue
		}
		n := min(uint32(len(p)), d.remaining)
		d.body(p[:n])
		d.remaining -= n
		p = p[n:]
		if d.remaining == 0 {
			d.end()
		}
	}
}

func (d *demux) Close() error { return nil }

// begin starts a reply once its header is in.
func (d *demux) begin() {
	h := parseHeader(d.hdr[:])
	d.tag = h.tag
	d.remaining = 0
	if h.size > headerSize {
		d.remaining = h.size - headerSize
	}
	d.written = 0
	d.cur = d.b.lookup(h.tag)
	if d.cur == nil {
		d.b.guestLog.Warn("virtio-9p: 9P server replied to an unknown tag; dropping the reply", "tag", h.tag, "type", h.typ)
	} else if d.cur.chain != nil {
		d.beginChain(d.cur, h)
	}
	if d.cur != nil && d.cur.capture != nil {
		d.cur.capture = append(d.cur.capture[:0], d.hdr[:]...)
	}
	if d.remaining == 0 {
		d.end()
	}
}

// beginChain writes the start of the reply h into p's chain: its header
// with the guest's tag, or an Rlerror instead of a reply the chain cannot
// hold or that carries zeros for a Twrite's unreadable data.
func (d *demux) beginChain(p *pending, h header) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.orphaned:
	case p.dataFailed:
		// The server wrote zeros for what guest memory could not
		// supply: do not report success.
		p.failed = true
		d.b.guestLog.Warn("virtio-9p: cannot read a 9P write's data from guest memory; answering EIO")
		d.written = d.writeChain(p, rlerror(p.guestTag, linux.EIO))
	case h.size > p.chain.WritableLen():
		// The guest's reply buffers are too small: tell it so instead
		// of truncating a reply it would misparse.
		p.failed = true
		d.written = d.writeChain(p, rlerror(p.guestTag, errMsgSize))
	default:
		hdr := d.hdr
		binary.LittleEndian.PutUint16(hdr[5:7], p.guestTag)
		d.written = d.writeChain(p, hdr[:])
	}
}

func (d *demux) body(b []byte) {
	p := d.cur
	if p == nil {
		return
	}
	if p.capture != nil && len(p.capture) < 64 {
		p.capture = append(p.capture, b[:min(len(b), 64-len(p.capture))]...)
	}
	if p.chain == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.orphaned && !p.failed {
		d.written += d.writeChain(p, b)
	}
}

// writeChain writes into p's chain; a short write marks the reply failed.
func (d *demux) writeChain(p *pending, b []byte) uint32 {
	n, err := p.chain.Writer().Write(b)
	if err != nil || n < len(b) {
		p.failed = true
		d.b.guestLog.Warn("virtio-9p: cannot write a 9P reply into the guest's buffers", "err", err)
	}
	return uint32(n)
}

// end completes the current reply.
func (d *demux) end() {
	p, tag := d.cur, d.tag
	d.hdrN, d.cur = 0, nil
	if p == nil {
		return
	}
	if p.chain != nil {
		p.completeReply(d.written)
	}
	d.b.finish(tag, p)
}

// completeReply completes p's chain with the written bytes of its reply,
// unless it was orphaned.
func (p *pending) completeReply(written uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.orphaned {
		return
	}
	if err := p.queue.Complete(p.chain, written, p.irq); err != nil {
		p.irq.NeedsReset(fmt.Errorf("virtio-9p: completing a request: %w", err))
	}
}
