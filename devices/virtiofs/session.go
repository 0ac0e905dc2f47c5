package virtiofs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// session is one activation of the device: one FUSE connection, from the
// guest's FUSE_INIT to the device's reset. A worker per queue pops chains
// and hands each to a goroutine of its own, at most MaxInFlight at once;
// replies complete out of order, as virtio allows.
type session struct {
	d      *Device
	mem    virtio.GuestMemory
	slicer virtio.Slicer // nil: every request goes through bounce buffers
	irq    virtio.Interrupt
	queues []*virtio.Queue
	fs     *fileSystem
	server *fuse.ProtocolServer

	wakes [numQueues]chan struct{}
	stop  chan struct{}
	slots chan struct{} // one token per request in flight
	// running counts the queue workers and the requests in flight; end
	// waits for it, so no guest buffer is used after Reset.
	running sync.WaitGroup
	// initMu is held exclusively by a FUSE_INIT and shared by every other
	// request: go-fuse's INIT rewrites the negotiated settings other
	// requests' parsing reads, and a guest may send INIT again at any time.
	initMu sync.RWMutex
	// init is the guest's last FUSE_INIT request that go-fuse accepted
	// (nil before one), guarded by initMu: a session saved with a
	// snapshot replays it into the restored session's server.
	init []byte
}

func startSession(d *Device, mem virtio.GuestMemory, irq virtio.Interrupt, queues []*virtio.Queue, fsys *fileSystem, server *fuse.ProtocolServer) *session {
	s := &session{
		d: d, mem: mem, irq: irq, queues: queues, fs: fsys, server: server,
		stop:  make(chan struct{}),
		slots: make(chan struct{}, d.opts.MaxInFlight),
	}
	s.slicer, _ = mem.(virtio.Slicer)
	for q := range s.wakes {
		s.wakes[q] = make(chan struct{}, 1)
		s.running.Add(1)
		go s.work(q)
	}
	return s
}

// wake tells queue q's worker that the driver made buffers available.
// Out-of-range queues were refused by the transport.
func (s *session) wake(q int) {
	select {
	case s.wakes[q] <- struct{}{}:
	default:
	}
}

// end stops the workers, waits for every request in flight and closes the
// session's nodes and handles.
func (s *session) end() {
	close(s.stop)
	s.running.Wait()
	s.fs.t.closeAll()
}

func (s *session) work(q int) {
	defer s.running.Done()
	for {
		if !s.drain(q) {
			return
		}
		select {
		case <-s.wakes[q]:
		case <-s.stop:
			return
		}
	}
}

// drain starts a request for every available chain of queue q; false
// means stop (the queue broke or the session ends).
func (s *session) drain(q int) bool {
	queue := s.queues[q]
	for {
		chain, err := queue.Pop()
		var chainErr *virtio.ChainError
		switch {
		case errors.As(err, &chainErr):
			s.d.guestLog.Warn("virtio-fs: refused a request chain", "err", err)
			if queue.NeedsInterrupt() {
				s.irq.SignalUsed()
			}
			continue
		case err != nil:
			s.irq.NeedsReset(err)
			return false
		case chain == nil:
			return true
		}
		select {
		case s.slots <- struct{}{}:
		case <-s.stop:
			return false // the chain goes with the reset
		}
		s.running.Add(1)
		go s.serve(queue, chain)
	}
}

// serve answers one chain and completes it, also when a file operation
// ends the goroutine (runtime.Goexit): the request is then answered EIO
// rather than left pending.
func (s *session) serve(queue *virtio.Queue, chain *virtio.Chain) {
	defer func() { <-s.slots; s.running.Done() }()
	var n uint32
	answered := false
	defer func() {
		if !answered {
			s.d.log.Error("virtio-fs: a request's goroutine exited; answered EIO")
			n = errorReply(chain, [][]byte{s.header(chain)}, fuse.EIO)
		}
		if err := queue.Complete(chain, n, s.irq); err != nil {
			s.irq.NeedsReset(fmt.Errorf("virtio-fs: completing a request: %w", err))
		}
	}()
	n = s.handle(chain)
	answered = true
}

// header reads the first bytes of chain's request (its FUSE header) from
// guest memory, whatever the chain's reader consumed.
func (s *session) header(chain *virtio.Chain) []byte {
	hdr := make([]byte, 0, outHeaderSize)
	for _, b := range chain.Readable() {
		p := make([]byte, min(b.Len, uint32(cap(hdr)-len(hdr))))
		if s.mem.ReadAt(p, b.Addr) != nil {
			break
		}
		hdr = append(hdr, p...)
	}
	return hdr
}

// handle runs one request and returns how many bytes of reply it wrote.
// A request the protocol server cannot take (too short, too large, a reply
// that does not fit) is answered with an error header when the chain has
// room for one, so the guest's request ends instead of hanging.
func (s *session) handle(chain *virtio.Chain) uint32 {
	if chain.ReadableLen() > maxMessage {
		s.d.guestLog.Warn("virtio-fs: request larger than the device accepts", "bytes", chain.ReadableLen(), "max", maxMessage)
		return errorReply(chain, nil, fuse.Status(syscall.E2BIG))
	}
	msg, err := s.message(chain)
	if err != nil {
		s.d.guestLog.Warn("virtio-fs: reading a request", "err", err)
		return errorReply(chain, nil, fuse.EIO)
	}
	if opcodeOf(msg.in) == fuseSyncFS && chain.ReadableLen() >= syncFSRequestSize {
		return errorReply(chain, msg.in, s.syncFS())
	}
	n, st := s.run(msg.in, msg.out)
	if !st.Ok() {
		return errorReply(chain, msg.in, st)
	}
	if n > 0 && n < outHeaderSize {
		return 0 // go-fuse cut the reply header to the room there was
	}
	var length [4]byte
	if copyFromIov(length[:], msg.out); n > 0 && binary.LittleEndian.Uint32(length[:]) != uint32(n) {
		// go-fuse cut a reply whose size the request does not bound
		// (READLINK's target) to the room there was: an error, not a
		// header claiming bytes that were never written.
		return errorReply(chain, msg.in, fuse.EIO)
	}
	if msg.bounce != nil {
		written, _ := chain.Writer().Write(msg.bounce[:n])
		return uint32(written)
	}
	return uint32(n)
}

// run calls the protocol server; a panic in it (go-fuse parsing a request
// it did not expect, or a file operation) is EIO for this request only.
func (s *session) run(in, out [][]byte) (n int, st fuse.Status) {
	init := opcodeOf(in) == fuseInit
	if init {
		s.initMu.Lock()
		defer s.initMu.Unlock()
	} else {
		s.initMu.RLock()
		defer s.initMu.RUnlock()
	}
	defer func() {
		if r := recover(); r != nil {
			s.d.log.Error("virtio-fs: a request panicked; answered EIO", "panic", r, "stack", string(debug.Stack()))
			n, st = 0, fuse.EIO
		}
	}()
	if init {
		return s.serveInit(in, out)
	}
	return s.server.HandleRequest(in, out)
}

// serveInit serves a FUSE_INIT from a copy of its request into a reply of
// its own, then copied to the guest's buffers: the session records
// exactly the request go-fuse took, and whether go-fuse accepted it,
// whatever the guest writes to its buffers meanwhile. initMu is held.
func (s *session) serveInit(in, out [][]byte) (int, fuse.Status) {
	if iovLen(out) < initReplySize {
		return 0, fuse.EIO // as go-fuse refuses it, before serving it
	}
	req := make([]byte, min(iovLen(in), initRequestSize))
	copyFromIov(req, in)
	reply := make([]byte, initReplySize)
	n, st := s.server.HandleRequest([][]byte{req}, [][]byte{reply})
	if !st.Ok() {
		return 0, st
	}
	if initAccepted(reply[:n]) {
		s.init = req
	}
	copyToIov(out, reply[:n])
	return n, st
}

// initAccepted says whether an INIT reply carries no error.
func initAccepted(reply []byte) bool {
	return len(reply) >= outHeaderSize && binary.LittleEndian.Uint32(reply[4:8]) == 0
}

// FUSE_INIT's sizes: the request go-fuse reads (the header, 40 bytes, and
// fuse_init_in, 64) and its reply (the header and fuse_init_out, 64).
const (
	initRequestSize = 40 + 64
	initReplySize   = outHeaderSize + 64
)

// syncFS answers FUSE_SYNCFS, the guest's sync(2) or syncfs(2) of the
// mount, which go-fuse does not serve (the guest would take its ENOSYS as
// "nothing to do" and never ask again): what the guest wrote reaches the
// host's disk, not only its page cache. A root with nothing writable (the
// system directories' device) has nothing to sync.
func (s *session) syncFS() fuse.Status {
	return status(s.d.opts.Root.SyncWritable())
}

// opcodeOf returns the opcode of the request whose header is in (0 when
// the request is shorter than its opcode).
func opcodeOf(in [][]byte) uint32 {
	var hdr [8]byte // len[4] opcode[4]
	copyFromIov(hdr[:], in)
	return binary.LittleEndian.Uint32(hdr[4:])
}

// FUSE opcodes the session serves itself, around go-fuse: INIT (under
// initMu) and SYNCFS, whose request is a header (40 bytes) and a
// fuse_syncfs_in (8 bytes of padding); a shorter one goes to go-fuse,
// which refuses it.
const (
	fuseInit          = 26
	fuseSyncFS        = 50
	syncFSRequestSize = 48
)

// outHeaderSize is the size of a FUSE reply header: len[4] error[4]
// unique[8].
const outHeaderSize = 16

// errorReply writes a FUSE reply header carrying st for the request whose
// header is in (nil: read it from the chain) and returns its length, or 0
// when the chain cannot take it.
func errorReply(chain *virtio.Chain, in [][]byte, st fuse.Status) uint32 {
	var hdr [16]byte
	if in != nil {
		copyFromIov(hdr[:], in)
	} else {
		_, _ = chain.Reader().Read(hdr[:])
	}
	unique := binary.LittleEndian.Uint64(hdr[8:16])
	var out [outHeaderSize]byte
	binary.LittleEndian.PutUint32(out[0:], uint32(len(out)))
	binary.LittleEndian.PutUint32(out[4:], uint32(-int32(st)))
	binary.LittleEndian.PutUint64(out[8:], unique)
	if chain.WritableLen() < uint32(len(out)) {
		return 0
	}
	n, _ := chain.Writer().Write(out[:])
	return uint32(n)
}

// iovLen is the number of bytes of iov.
func iovLen(iov [][]byte) int {
	n := 0
	for _, b := range iov {
		n += len(b)
	}
	return n
}

// copyToIov copies src over the first bytes of iov.
func copyToIov(iov [][]byte, src []byte) {
	for _, b := range iov {
		n := copy(b, src)
		src = src[n:]
		if len(src) == 0 {
			return
		}
	}
}

// copyFromIov copies the first bytes of iov into dst.
func copyFromIov(dst []byte, iov [][]byte) {
	for _, b := range iov {
		n := copy(dst, b)
		dst = dst[n:]
		if len(dst) == 0 {
			return
		}
	}
}
