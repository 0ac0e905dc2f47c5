package devices

import (
	"sync"
	"time"
)

// IRQ is an interrupt line into the guest. Trigger raises one edge (for a
// KVM irqfd, one write to the eventfd). It is safe for concurrent use and
// must not block for long: devices call it from vCPU threads and from their
// own goroutines.
type IRQ interface {
	Trigger() error
}

// IRQFunc adapts a function to the IRQ interface.
type IRQFunc func() error

// Trigger calls f.
func (f IRQFunc) Trigger() error { return f() }

// LogLimiter decides whether a log line about guest misbehaviour may be
// written, so that a hostile guest cannot flood the host's log. It allows
// Burst lines per Interval and counts the ones it suppressed. The zero value
// allows 10 lines per minute. It is safe for concurrent use.
type LogLimiter struct {
	Burst    int           // lines allowed per interval; 0 means 10
	Interval time.Duration // 0 means one minute

	mu         sync.Mutex
	windowEnd  time.Time
	used       int
	suppressed uint64
}

// Allow reports whether a line may be logged now. When it returns true after
// lines were suppressed, suppressed is how many were dropped since the last
// allowed line, so the caller can say so in the line it writes.
func (l *LogLimiter) Allow() (ok bool, suppressed uint64) {
	burst, interval := l.Burst, l.Interval
	if burst <= 0 {
		burst = 10
	}
	if interval <= 0 {
		interval = time.Minute
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.After(l.windowEnd) {
		l.windowEnd = now.Add(interval)
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
