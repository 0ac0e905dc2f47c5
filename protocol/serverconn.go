package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// writeTimeout bounds one frame write: a client that stops reading for this
// long is treated as gone, so it cannot pin handler goroutines forever.
const writeTimeout = 30 * time.Second

// hangupPollInterval is how often a half-closed connection is checked for a
// full close (see waitForHangup).
const hangupPollInterval = time.Second

// noPeerUID is the uid bucket of connections whose peer uid is unknown
// (not a Unix socket, or SO_PEERCRED failed).
const noPeerUID = -1

// serverConn is one client connection.
type serverConn struct {
	s    *Server
	conn net.Conn
	uid  int64 // the peer's uid, or noPeerUID
	// accepted is when the connection was accepted (for log lines).
	accepted time.Time
	// ctx ends when the connection is closed or the server shuts down; it
	// is the context of every handler call made for this connection, and
	// carries the connection's ConnState.
	ctx    context.Context
	cancel context.CancelFunc

	wmu       sync.Mutex // serialises frame writes
	closeOnce sync.Once
}

func (s *Server) startConn(conn net.Conn) {
	uid := int64(noPeerUID)
	if uc, ok := conn.(*net.UnixConn); ok {
		if u, err := PeerUID(uc); err == nil {
			uid = int64(u)
		}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = conn.Close()
		return
	}
	// A new connection over the uid's bound of waiting ones takes the
	// oldest one's place, so it counts against MaxConns only if there is
	// none to take.
	waiting := s.waiting[uid]
	evict := len(waiting) >= s.maxIdle
	if len(s.conns) >= s.maxConns && !evict {
		s.mu.Unlock()
		s.peerLog.Warn("too many client connections; closing new one", "limit", s.maxConns, "uid", uid)
		_ = conn.Close()
		return
	}
	c := &serverConn{s: s, conn: conn, uid: uid, accepted: time.Now()}
	c.ctx, c.cancel = context.WithCancel(WithConnState(s.ctx))
	var oldest *serverConn
	if evict {
		// Off the books at once (closed just below): its goroutine may take
		// a while to end, and must not hold a slot meanwhile.
		oldest = waiting[0]
		waiting = slices.Delete(waiting, 0, 1)
		delete(s.conns, oldest)
	}
	s.conns[c] = struct{}{}
	s.waiting[uid] = append(waiting, c)
	s.wg.Add(1)
	s.mu.Unlock()

	if oldest != nil {
		s.peerLog.Warn("too many client connections that sent no request yet; closing the oldest",
			"uid", uid, "limit", s.maxIdle, "idle", time.Since(oldest.accepted).Round(time.Millisecond))
		oldest.close()
	}

	go func() {
		defer s.wg.Done()
		defer s.forget(c)
		defer c.close()
		c.serve()
	}()
}

// forget removes an ended connection from the server's books.
func (s *Server) forget(c *serverConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	s.stopWaiting(c)
}

// stopWaiting takes c off the list of connections without a first request
// and reports whether it was there (false: it was closed to make room).
// Called with s.mu held.
func (s *Server) stopWaiting(c *serverConn) bool {
	waiting := s.waiting[c.uid]
	i := slices.Index(waiting, c)
	if i < 0 {
		return false
	}
	if len(waiting) == 1 {
		delete(s.waiting, c.uid)
	} else {
		s.waiting[c.uid] = slices.Delete(waiting, i, i+1)
	}
	return true
}

// gotFirstRequest ends c's wait for its first request: no read deadline
// from now on. It reports false if c was closed to make room meanwhile.
func (c *serverConn) gotFirstRequest() bool {
	c.s.mu.Lock()
	ok := c.s.stopWaiting(c)
	c.s.mu.Unlock()
	if ok {
		_ = c.conn.SetReadDeadline(time.Time{})
	}
	return ok
}

// close ends the connection and its context. Safe to call many times and
// from any goroutine.
func (c *serverConn) close() {
	c.closeOnce.Do(func() {
		c.cancel()
		_ = c.conn.Close()
	})
}

// serve reads frames until the first valid request decides the mode; it
// must come within the server's first-request timeout (invalid frames
// before it, answered, do not extend it).
func (c *serverConn) serve() {
	_ = c.conn.SetReadDeadline(c.accepted.Add(c.s.firstTimeout))
	for {
		req, ok := c.readRequest()
		if !ok {
			return
		}
		if req == nil {
			continue // invalid frame, already answered
		}
		if !c.gotFirstRequest() {
			return
		}
		switch {
		case req.Method == MethodSubscribeEvents:
			c.serveSubscription(*req)
		case req.ID == nil:
			c.serveOneShot(*req)
		default:
			c.servePipe(*req)
		}
		return
	}
}

// readRequest reads one frame. It returns ok=false when the connection is
// done (EOF, I/O error, oversized frame — the latter answered first), and
// req=nil with ok=true for a frame that was not a valid request (answered,
// keep reading).
func (c *serverConn) readRequest() (req *Request, ok bool) {
	body, err := ReadFrame(c.conn)
	if err != nil {
		switch {
		case errors.Is(err, ErrFrameTooLarge):
			c.s.peerLog.Warn("client sent an oversized frame; closing its connection", "err", err)
			c.writeResponse(NewError(nil, fmt.Sprintf("%v; closing connection", err)))
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Only the wait for the first request has a read deadline.
			c.s.peerLog.Warn("client connection sent no request in time; closing it",
				"timeout", c.s.firstTimeout, "uid", c.uid)
		case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), c.ctx.Err() != nil:
		default:
			c.s.log.Debug("client connection read failed", "err", err)
		}
		return nil, false
	}
	r, err := DecodeRequest(body)
	if err != nil {
		var de *DecodeError
		var rawID json.RawMessage
		if errors.As(err, &de) {
			rawID = de.RawID
		}
		c.s.peerLog.Warn("client sent an invalid request", "err", err)
		c.writeRaw(struct {
			Success bool            `json:"success"`
			Error   string          `json:"error"`
			ID      json.RawMessage `json:"id,omitempty"`
		}{false, err.Error(), rawID})
		return nil, true
	}
	if c.s.debug.Load() {
		c.s.log.Info("request", "method", r.Method, "id", fmtID(r.ID), "paramsBytes", len(r.Params))
	}
	return &r, true
}

func fmtID(id *uint64) any {
	if id == nil {
		return "none"
	}
	return *id
}

// serveOneShot answers one request and closes. A one-shot client
// half-closes after sending, so EOF on the read side does not cancel the
// call.
func (c *serverConn) serveOneShot(req Request) {
	c.writeResponse(c.call(req))
}

// servePipe handles the persistent pipe: every request in its own
// goroutine, at most maxInFlight at once.
func (c *serverConn) servePipe(first Request) {
	sem := make(chan struct{}, c.s.maxInFlight)
	var inflight sync.WaitGroup
	dispatch := func(req Request) bool {
		select {
		case sem <- struct{}{}:
		case <-c.ctx.Done():
			return false
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer func() { <-sem }()
			c.writeResponse(c.call(req))
		}()
		return true
	}

	if dispatch(first) {
		for {
			req, ok := c.readRequest()
			if !ok {
				break
			}
			if req == nil {
				continue
			}
			if req.Method == MethodSubscribeEvents {
				c.writeResponse(NewError(req.ID, "subscribeEvents must be the first request of its own connection"))
				continue
			}
			if !dispatch(*req) {
				break
			}
		}
	}
	// Reading is over. If the client only half-closed, let the calls in
	// flight finish and deliver their replies; if it is gone, cancel them.
	done := make(chan struct{})
	go func() {
		inflight.Wait()
		close(done)
	}()
	c.waitForHangup(done)
	<-done
}

// serveSubscription acks, then streams events until either side ends.
func (c *serverConn) serveSubscription(req Request) {
	sub, err := c.subscribe(req.Params)
	if err != nil {
		c.writeResponse(NewError(req.ID, err.Error()))
		return
	}
	var cancelOnce sync.Once
	cancelSub := func() {
		cancelOnce.Do(func() {
			if sub.Cancel != nil {
				sub.Cancel()
			}
		})
	}
	defer cancelSub()

	ack, _ := NewResult(req.ID, nil)
	if !c.writeResponse(ack) {
		return
	}
	if c.s.debug.Load() {
		c.s.log.Info("event subscription started")
	}

	// The client sends nothing more; drain (and discard) whatever comes so
	// that a full close is noticed at once.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		_, _ = io.Copy(io.Discard, c.conn)
		c.waitForHangup(c.ctx.Done())
		c.close()
	}()
	defer func() {
		c.close()
		<-readerDone
	}()

	for {
		select {
		case <-c.ctx.Done():
			return
		case ev, ok := <-sub.Events:
			if !ok {
				return
			}
			if !c.writeEvent(ev) {
				return
			}
			if sub.Delivered != nil {
				sub.Delivered()
			}
		}
	}
}

// writeEvent writes one event frame. It reports false when the write
// failed (the connection is then closed); an event that cannot be sent at
// all is dropped with a log line and reported written, so that it is not
// retried forever.
func (c *serverConn) writeEvent(ev Event) bool {
	body, err := json.Marshal(ev)
	if err != nil {
		c.s.log.Warn("dropping event that cannot be encoded", "type", ev.Type, "err", err)
		return true
	}
	if len(body) > MaxFrameSize {
		c.s.log.Warn("dropping event larger than a frame", "type", ev.Type, "bytes", len(body))
		return true
	}
	return c.writeBody(body)
}

// waitForHangup returns when done is closed or the peer has fully closed
// the connection (after which the connection is closed, cancelling every
// call in flight). A half-closed peer (shutdown of its write side only) is
// still waiting for replies and is left alone.
func (c *serverConn) waitForHangup(done <-chan struct{}) {
	if peerHungUp(c.conn) {
		c.close()
		return
	}
	t := time.NewTicker(hangupPollInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-c.ctx.Done():
			return
		case <-t.C:
			if peerHungUp(c.conn) {
				c.close()
				return
			}
		}
	}
}

// peerHungUp reports whether conn's peer closed both directions (POLLHUP),
// without blocking. A connection without a descriptor reports false.
func peerHungUp(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	hup := false
	_ = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: 0}}
		n, err := unix.Poll(fds, 0)
		hup = err == nil && n > 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
	})
	return hup
}

// call runs one request through the handler and builds its reply.
func (c *serverConn) call(req Request) Response {
	if !IsKnownMethod(req.Method) {
		return NewError(req.ID, UnknownMethodError(req.Method).Error())
	}
	start := time.Now()
	result, err := c.handle(req)
	if c.s.debug.Load() {
		c.s.log.Info("reply", "method", req.Method, "id", fmtID(req.ID), "took", time.Since(start), "err", err)
	}
	if err != nil {
		if errors.Is(err, ErrUnknownMethod) {
			return NewError(req.ID, UnknownMethodError(req.Method).Error())
		}
		return NewError(req.ID, err.Error())
	}
	resp, err := NewResult(req.ID, result)
	if err != nil {
		c.s.log.Error("handler result cannot be encoded", "method", req.Method, "err", err)
		return NewError(req.ID, fmt.Sprintf("%s: %v", req.Method, err))
	}
	return resp
}

// handle calls the Handler, turning a panic into an error.
func (c *serverConn) handle(req Request) (result any, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.s.log.Error("handler panicked", "method", req.Method, "panic", r, "stack", string(debug.Stack()))
			result, err = nil, fmt.Errorf("internal error in %s: %v", req.Method, r)
		}
	}()
	return c.s.handler.Handle(c.ctx, req.Method, req.Params)
}

// subscribe calls Handler.Subscribe, turning a panic into an error.
func (c *serverConn) subscribe(params json.RawMessage) (sub *Subscription, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.s.log.Error("subscribe panicked", "panic", r, "stack", string(debug.Stack()))
			sub, err = nil, fmt.Errorf("internal error in subscribeEvents: %v", r)
		}
	}()
	sub, err = c.s.handler.Subscribe(c.ctx, params)
	if err == nil && (sub == nil || sub.Events == nil) {
		if sub != nil && sub.Cancel != nil {
			sub.Cancel()
		}
		return nil, errors.New("internal error in subscribeEvents: no event stream")
	}
	return sub, err
}

// writeResponse writes one reply, replacing one too large for a frame by an
// error. It reports whether the write succeeded; a failed write closes the
// connection.
func (c *serverConn) writeResponse(resp Response) bool {
	body, err := json.Marshal(resp)
	if err == nil && len(body) > MaxFrameSize {
		c.s.log.Warn("reply too large for a frame; sending an error instead", "bytes", len(body))
		body, err = json.Marshal(NewError(resp.ID,
			fmt.Sprintf("reply of %d bytes exceeds the 10 MiB frame limit", len(body))))
	}
	if err != nil {
		c.s.log.Error("cannot encode reply", "err", err)
		return false
	}
	return c.writeBody(body)
}

func (c *serverConn) writeRaw(v any) bool {
	body, err := json.Marshal(v)
	if err != nil {
		c.s.log.Error("cannot encode reply", "err", err)
		return false
	}
	return c.writeBody(body)
}

// writeBody writes one frame under the write mutex, with a deadline.
func (c *serverConn) writeBody(body []byte) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	err := WriteFrame(c.conn, body)
	if err != nil {
		if c.ctx.Err() == nil {
			c.s.log.Debug("client connection write failed; closing it", "err", err)
		}
		c.close()
		return false
	}
	return true
}
