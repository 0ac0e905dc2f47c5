package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of a Limiter's zero value.
const (
	DefaultBurst    = 10
	DefaultInterval = time.Minute
)

// Limiter allows Burst events per Interval (a fixed window that opens with
// the first event after the previous one closed) and counts the events it
// refuses. The zero value allows DefaultBurst events per DefaultInterval.
// Its exported fields must not change once it is in use; it must not be
// copied after first use.
type Limiter struct {
	Burst    int           // events allowed per interval; 0 means DefaultBurst
	Interval time.Duration // 0 means DefaultInterval
	// Now is the clock; nil means time.Now. Tests inject one.
	Now func() time.Time

	mu         sync.Mutex
	windowEnd  time.Time
	used       int
	suppressed uint64
}

// Allow reports whether an event may be logged now. When it returns true
// after refusing some, suppressed is how many it refused since the last
// allowed event, so that the line written can say so.
func (l *Limiter) Allow() (ok bool, suppressed uint64) {
	burst, interval, now := l.Burst, l.Interval, l.Now
	if burst <= 0 {
		burst = DefaultBurst
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	if now == nil {
		now = time.Now
	}
	t := now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !t.Before(l.windowEnd) {
		l.windowEnd = t.Add(interval)
		l.used = 0
	}
	if l.used >= burst {
		l.suppressed++
		return false, 0
	}
	l.used++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}

// Logger writes lines through a Limiter. Lines at a level its handler does
// not log are dropped without using the budget.
type Logger struct {
	log   *slog.Logger
	limit *Limiter
}

// New returns a Logger writing to log (nil: nowhere) at limit's rate (nil:
// a Limiter of its own with the defaults). Loggers given the same Limiter
// share one budget.
func New(log *slog.Logger, limit *Limiter) *Logger {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if limit == nil {
		limit = &Limiter{}
	}
	return &Logger{log: log, limit: limit}
}

// Debug logs at debug level, rate-limited.
func (l *Logger) Debug(msg string, args ...any) {
	l.Log(context.Background(), slog.LevelDebug, msg, args...)
}

// Info logs at info level, rate-limited.
func (l *Logger) Info(msg string, args ...any) {
	l.Log(context.Background(), slog.LevelInfo, msg, args...)
}

// Warn logs at warning level, rate-limited.
func (l *Logger) Warn(msg string, args ...any) {
	l.Log(context.Background(), slog.LevelWarn, msg, args...)
}

// Error logs at error level, rate-limited.
func (l *Logger) Error(msg string, args ...any) {
	l.Log(context.Background(), slog.LevelError, msg, args...)
}

// Log writes msg at level unless the budget is spent, adding
// "suppressed"=N when lines were dropped since the last one written.
func (l *Logger) Log(ctx context.Context, level slog.Level, msg string, args ...any) {
	if !l.log.Enabled(ctx, level) {
		return
	}
	ok, suppressed := l.limit.Allow()
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args[:len(args):len(args)], "suppressed", suppressed)
	}
	l.log.Log(ctx, level, msg, args...)
}
