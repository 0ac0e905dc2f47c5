package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cowork-vmm/cowork-vmm/internal/acceptloop"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// Handler serves the client's methods. The server calls it from many
// goroutines at once (one per in-flight pipe request, one per connection):
// implementations must be safe for concurrent use.
type Handler interface {
	// Handle runs one method and returns its result (marshalled as
	// "result"; nil leaves it out) or an error (its message becomes
	// "error"). It is called only for names in Methods other than
	// subscribeEvents; an error wrapping ErrUnknownMethod is sent as
	// "Unknown method: <name>". ctx ends when the connection closes or the
	// server shuts down. A panic is recovered and replied as an error.
	Handle(ctx context.Context, method string, params json.RawMessage) (result any, err error)

	// Subscribe starts an event subscription (subscribeEvents). After it
	// returns, the server writes the ack {success:true} and then every
	// Event received from the subscription, until the client closes the
	// connection (the server then calls Cancel), the producer closes Events,
	// or ctx ends. An error is replied as {success:false, error} and the
	// connection closed.
	Subscribe(ctx context.Context, params json.RawMessage) (*Subscription, error)
}

// Subscription is one event stream handed to the server by Handler.Subscribe.
type Subscription struct {
	// Events delivers the events to send, in order. The producer closes it
	// to end the subscription (the server then closes the connection). The
	// server may stop reading at any time; it always calls Cancel when it
	// does, so the producer must not block forever on a full channel
	// without also watching for Cancel (or use a bounded, dropping buffer).
	Events <-chan Event
	// Cancel is called exactly once by the server when it stops reading
	// Events (client gone, write error, shutdown). May be nil.
	Cancel func()
	// Delivered, when set, is called once for each event taken from
	// Events after it has been written whole to the connection (or
	// dropped for good: it cannot be encoded or exceeds a frame), before
	// the next one is taken. An event whose write failed is not
	// delivered: the producer may hand it to the next subscription. It is
	// called from the server's writer and must not block for long.
	Delivered func()
}

// ServerConfig configures a Server. Only Handler is required.
type ServerConfig struct {
	Handler Handler
	// Logger receives one line per event worth knowing; nil = slog.Default().
	Logger *slog.Logger
	// MaxInFlight bounds the requests handled concurrently on one pipe
	// connection; further requests wait (back-pressure on that connection
	// only). Default DefaultMaxInFlight.
	MaxInFlight int
	// MaxConns bounds simultaneous connections; extra ones are closed at
	// once with a log line. Default DefaultMaxConns.
	MaxConns int
	// FirstRequestTimeout bounds the wait for a connection's first request
	// (the frame that decides its mode); a connection without one by then
	// is closed with a log line. Once the mode is decided no read deadline
	// applies (an event subscription is idle by design). Default
	// DefaultFirstRequestTimeout.
	FirstRequestTimeout time.Duration
	// MaxIdlePerUID bounds the connections of one peer uid (SO_PEERCRED;
	// connections without one share a bucket) that have not sent their
	// first request yet. A new connection over it closes the oldest of
	// them, with a log line: a live client writes its request as soon as it
	// has connected, so it is the newest, never the oldest. Default
	// DefaultMaxIdlePerUID.
	MaxIdlePerUID int
}

// Defaults for ServerConfig.
const (
	DefaultMaxInFlight         = 64
	DefaultMaxConns            = 256
	DefaultFirstRequestTimeout = 10 * time.Second
	DefaultMaxIdlePerUID       = 32
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("protocol: server closed")

// Server serves the client contract on a listener. The first frame on a
// connection decides its mode:
//   - no id: one-shot — one reply, then the connection is closed;
//   - method subscribeEvents: subscription — the ack first, then events only;
//   - a numeric id: persistent pipe — every request runs in its own
//     goroutine (at most MaxInFlight at once), replies carry the request's id
//     and are written whole under a write mutex, in completion order.
//
// A frame that is not a valid request is answered {success:false, error,
// id?} and the connection keeps being served. A frame whose declared length
// exceeds MaxFrameSize is answered with an error and that connection (only)
// is closed.
//
// Idle connections cannot lock the client out: until its first request a
// connection has FirstRequestTimeout to send it, and at most MaxIdlePerUID
// connections of one uid wait for theirs at once (the oldest gives way), so
// MaxConns is never filled by connections that say nothing. Lines a client
// can cause (refused or timed-out connections, bad frames) are
// rate-limited.
type Server struct {
	handler      Handler
	log          *slog.Logger
	peerLog      *ratelog.Logger // lines a client causes by what it sends, or does not
	maxInFlight  int
	maxConns     int
	firstTimeout time.Duration
	maxIdle      int
	debug        atomic.Bool

	ctx    context.Context // ended by Shutdown/Close; parent of every connection's ctx
	cancel context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*serverConn]struct{}
	// waiting holds the connections that have not sent their first
	// request, by peer uid (noPeerUID when unknown), oldest first.
	waiting map[int64][]*serverConn
	closed  bool
	wg      sync.WaitGroup // one per live connection goroutine
}

// NewServer returns a Server for cfg. It panics if cfg.Handler is nil
// (a programming error, not a runtime condition).
func NewServer(cfg ServerConfig) *Server {
	if cfg.Handler == nil {
		panic("protocol.NewServer: nil Handler")
	}
	s := &Server{
		handler:      cfg.Handler,
		log:          cfg.Logger,
		maxInFlight:  cfg.MaxInFlight,
		maxConns:     cfg.MaxConns,
		firstTimeout: cfg.FirstRequestTimeout,
		maxIdle:      cfg.MaxIdlePerUID,
		listeners:    make(map[net.Listener]struct{}),
		conns:        make(map[*serverConn]struct{}),
		waiting:      make(map[int64][]*serverConn),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.peerLog = ratelog.New(s.log, nil)
	if s.maxInFlight <= 0 {
		s.maxInFlight = DefaultMaxInFlight
	}
	if s.maxConns <= 0 {
		s.maxConns = DefaultMaxConns
	}
	if s.firstTimeout <= 0 {
		s.firstTimeout = DefaultFirstRequestTimeout
	}
	if s.maxIdle <= 0 {
		s.maxIdle = DefaultMaxIdlePerUID
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// SetDebug turns per-frame logging on or off (setDebugLogging). The lines
// are logged at Info level so that they show whatever the logger's level.
func (s *Server) SetDebug(on bool) { s.debug.Store(on) }

// Serve accepts connections on l until l fails or the server is shut down;
// it then returns ErrServerClosed (after Shutdown/Close) or the accept
// error. A transient accept failure (EMFILE, ENFILE, ECONNABORTED…) is
// logged, rate-limited, and retried after a backoff (acceptloop.Serve).
// Serve may be called on several listeners at once.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()

	err := acceptloop.Serve(s.ctx, l, acceptloop.Config{Log: s.log}, s.startConn)
	if err == nil || s.isClosed() {
		return ErrServerClosed
	}
	return fmt.Errorf("protocol: %w", err)
}

// Shutdown stops accepting, closes every listener and connection (ending
// their contexts and subscriptions), and waits for the connection
// goroutines to finish or ctx to end. Handlers still running see their
// context cancelled.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for l := range s.listeners {
		_ = l.Close()
	}
	for c := range s.conns {
		c.close()
	}
	s.mu.Unlock()
	s.cancel()

	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("protocol: shutdown: %w", ctx.Err())
	}
}

// Close is Shutdown without waiting.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Shutdown(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}
