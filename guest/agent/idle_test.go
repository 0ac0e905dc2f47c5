package agent

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestIdleDropper: the drop comes once the delay has passed with no
// process, not while one runs, and once per idle spell.
func TestIdleDropper(t *testing.T) {
	var drops atomic.Int32
	d := &idleDropper{delay: 50 * time.Millisecond, drop: func() error { drops.Add(1); return nil },
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}

	d.idle()
	d.busy() // a spawn came before the delay
	time.Sleep(150 * time.Millisecond)
	assert.Zero(t, drops.Load(), "no drop while a process runs")

	d.idle()
	assert.Eventually(t, func() bool { return drops.Load() == 1 }, 2*time.Second, 10*time.Millisecond, "a drop after the delay")
	time.Sleep(150 * time.Millisecond)
	assert.Equal(t, int32(1), drops.Load(), "one drop per idle spell")

	var none *idleDropper
	none.idle() // the process backend's agent has none
	none.busy()
}
