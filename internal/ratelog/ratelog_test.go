package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is a settable clock for Limiter.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newClock() *fakeClock { return &fakeClock{t: time.Unix(1_000_000, 0)} }

func TestLimiterBurstThenSuppressedCount(t *testing.T) {
	clock := newClock()
	l := &Limiter{Burst: 3, Interval: time.Second, Now: clock.now}
	for i := range 3 {
		ok, n := l.Allow()
		require.True(t, ok, "event %d of the burst", i)
		require.Zero(t, n)
	}
	for range 5 {
		ok, _ := l.Allow()
		require.False(t, ok, "over the burst")
	}
	clock.advance(999 * time.Millisecond)
	ok, _ := l.Allow()
	require.False(t, ok, "same window")

	clock.advance(time.Millisecond)
	ok, n := l.Allow()
	require.True(t, ok, "a new window")
	assert.Equal(t, uint64(6), n, "the first line of the new window says how many were dropped")
	ok, n = l.Allow()
	require.True(t, ok)
	assert.Zero(t, n, "the count is reported once")
}

func TestLimiterZeroValueDefaults(t *testing.T) {
	clock := newClock()
	l := &Limiter{Now: clock.now}
	for range DefaultBurst {
		ok, _ := l.Allow()
		require.True(t, ok)
	}
	ok, _ := l.Allow()
	require.False(t, ok)
	clock.advance(DefaultInterval)
	ok, n := l.Allow()
	require.True(t, ok)
	assert.Equal(t, uint64(1), n)
}

func TestLoggerAddsSuppressedAndSkipsDisabledLevels(t *testing.T) {
	var buf bytes.Buffer
	clock := newClock()
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	l := New(log, &Limiter{Burst: 2, Interval: time.Minute, Now: clock.now})

	for range 10 {
		l.Debug("not logged at this level") // does not use the budget
	}
	l.Warn("one", "k", 1)
	l.Info("two")
	l.Error("three") // suppressed
	l.Warn("four")   // suppressed
	clock.advance(time.Minute)
	l.Warn("five", "k", 5)

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 3, buf.String())
	assert.Contains(t, lines[0], "msg=one k=1")
	assert.NotContains(t, lines[0], "suppressed")
	assert.Contains(t, lines[1], "level=INFO msg=two")
	assert.Contains(t, lines[2], "msg=five k=5 suppressed=2")
}

func TestLoggerDoesNotGrowCallersArgs(t *testing.T) {
	var buf bytes.Buffer
	clock := newClock()
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), &Limiter{Burst: 1, Interval: time.Second, Now: clock.now})
	l.Warn("a")
	l.Warn("b")
	clock.advance(time.Second)
	args := make([]any, 2, 10)
	args[0], args[1] = "k", "v"
	l.Warn("c", args...)
	assert.Equal(t, []any{"k", "v"}, args[:2])
	assert.Nil(t, args[:4][2], "the suppressed attribute is not written into the caller's backing array")
}

func TestNilLoggerAndSharedLimiter(t *testing.T) {
	clock := newClock()
	shared := &Limiter{Burst: 1, Interval: time.Minute, Now: clock.now}
	var bufA, bufB bytes.Buffer
	New(nil, shared).Warn("to nowhere: spends nothing")
	a := New(slog.New(slog.NewTextHandler(&bufA, nil)), shared)
	b := New(slog.New(slog.NewTextHandler(&bufB, nil)), shared)
	a.Warn("spends the shared budget")
	b.Warn("dropped")
	assert.Contains(t, bufA.String(), "spends the shared budget")
	assert.Empty(t, bufB.String())
}

func TestLimiterConcurrentUse(t *testing.T) {
	l := &Limiter{Burst: 50, Interval: time.Hour}
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if ok, _ := l.Allow(); ok {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 50, allowed)
}
