package virtio

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWorker: a worker runs until Stop, which waits for it; wakes reach
// it, coalesced, and never block; a second Start while it runs is
// refused, and after Stop it can start again.
func TestWorker(t *testing.T) {
	var w Worker
	w.Wake() // not running: nothing happens
	assert.False(t, w.Stop())
	var woken atomic.Int32
	serve := func(wake, stop <-chan struct{}) {
		for {
			select {
			case <-wake:
				woken.Add(1)
			case <-stop:
				return
			}
		}
	}
	require.NoError(t, w.Start(serve))
	assert.ErrorIs(t, w.Start(serve), ErrWorkerRunning)
	for range 100 {
		w.Wake()
	}
	require.Eventually(t, func() bool { return woken.Load() > 0 }, 5*time.Second, time.Millisecond)
	assert.True(t, w.Stop())
	assert.False(t, w.Stop())
	require.NoError(t, w.Start(serve), "started again after a stop")
	assert.True(t, w.Stop())
}
