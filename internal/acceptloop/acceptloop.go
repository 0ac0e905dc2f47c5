package acceptloop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// Defaults of Config's backoff.
const (
	DefaultMinBackoff = 5 * time.Millisecond
	DefaultMaxBackoff = time.Second
)

// Config configures Serve. The zero value is usable.
type Config struct {
	// Log receives one line per transient accept failure, at most
	// ratelog's default rate; nil: nowhere.
	Log *slog.Logger
	// After a transient failure Serve waits MinBackoff, doubled at each
	// consecutive failure up to MaxBackoff; a successful accept resets it.
	// Zero values mean DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
}

// Serve accepts connections on l and passes each to handle, in Serve's own
// goroutine (handle must not block: it starts the connection's goroutine),
// until ctx ends or l fails for good.
//
// When ctx ends, Serve closes l (so that a blocked Accept returns) and
// returns nil; a connection accepted after that is closed, not handed on.
// A transient failure (see Temporary) is logged, rate-limited, and retried
// after a backoff. Any other failure is returned, wrapped: one wrapping
// net.ErrClosed means that l was closed while ctx had not ended.
func Serve(ctx context.Context, l net.Listener, cfg Config, handle func(net.Conn)) error {
	minBackoff, maxBackoff := cfg.MinBackoff, cfg.MaxBackoff
	if minBackoff <= 0 {
		minBackoff = DefaultMinBackoff
	}
	if maxBackoff <= 0 {
		maxBackoff = DefaultMaxBackoff
	}
	maxBackoff = max(maxBackoff, minBackoff)
	log := ratelog.New(cfg.Log, nil)

	stop := context.AfterFunc(ctx, func() { _ = l.Close() })
	defer stop()

	var backoff time.Duration
	for {
		conn, err := l.Accept()
		if ctx.Err() != nil {
			if conn != nil {
				_ = conn.Close()
			}
			return nil
		}
		if err == nil {
			backoff = 0
			handle(conn)
			continue
		}
		if !Temporary(err) {
			return fmt.Errorf("accept on %s: %w", addrOf(l), err)
		}
		backoff = nextBackoff(backoff, minBackoff, maxBackoff)
		log.Warn("accept failed; retrying", "addr", addrOf(l), "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
}

// nextBackoff is the wait after one more consecutive failure.
func nextBackoff(prev, minBackoff, maxBackoff time.Duration) time.Duration {
	return min(max(2*prev, minBackoff), maxBackoff)
}

// transientErrnos are the accept(2) failures that say nothing about the
// listening socket itself: resource exhaustion (EMFILE, ENFILE, ENOBUFS,
// ENOMEM), a connection that failed before it was taken (ECONNABORTED,
// EPROTO and the network errors Linux passes on from the new socket, see
// accept(2) "Error handling"), a firewall's refusal (EPERM), and
// interruptions.
var transientErrnos = []syscall.Errno{
	syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
	syscall.ECONNABORTED, syscall.EPROTO, syscall.EPERM,
	syscall.ENETDOWN, syscall.ENOPROTOOPT, syscall.EHOSTDOWN, syscall.ENONET,
	syscall.EHOSTUNREACH, syscall.EOPNOTSUPP, syscall.ENETUNREACH,
	syscall.EINTR, syscall.EAGAIN, syscall.ETIMEDOUT,
}

// Temporary reports whether an accept error is worth retrying: one of the
// transient errnos above, or a timeout. A closed listener (net.ErrClosed)
// and every other error are not.
func Temporary(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	for _, errno := range transientErrnos {
		if errors.Is(err, errno) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func addrOf(l net.Listener) string {
	if a := l.Addr(); a != nil {
		return a.String()
	}
	return "?"
}
