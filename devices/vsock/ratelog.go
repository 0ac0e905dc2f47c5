package vsock

import (
	"log/slog"
	"sync"
	"time"
)

// rateLog logs guest-caused problems without letting a guest flood the log:
// at most burst lines per window, then one line saying how many were dropped.
type rateLog struct {
	log    *slog.Logger
	burst  int
	window time.Duration

	mu         sync.Mutex
	start      time.Time
	count      int
	suppressed int
}

func newRateLog(log *slog.Logger) *rateLog {
	return &rateLog{log: log, burst: 10, window: 10 * time.Second}
}

// Warn logs msg unless this window's burst is spent.
func (r *rateLog) Warn(msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.start) >= r.window {
		if r.suppressed > 0 {
			r.log.Warn("vsock: guest-caused warnings suppressed", "count", r.suppressed, "window", r.window)
		}
		r.start, r.count, r.suppressed = now, 0, 0
	}
	if r.count >= r.burst {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	r.count++
	r.mu.Unlock()
	r.log.Warn(msg, args...)
}
