package virtio

import (
	"errors"
	"sync"
)

// ErrWorkerRunning is Worker.Start's error while a worker runs already
// (an Activate without a Reset).
var ErrWorkerRunning = errors.New("virtio: the device's worker runs already (activated twice without a reset)")

// Worker is a device's goroutine between Activate and Reset (the crosvm
// worker-thread shape): Start runs it, Wake nudges it from Notify without
// blocking (Notify comes on a vCPU thread), Stop ends it and waits for it.
// The zero value is ready to Start; safe for concurrent use.
type Worker struct {
	mu   sync.Mutex
	wake chan struct{}
	stop chan struct{}
	done chan struct{} // nil while no worker runs
}

// Start runs serve on a goroutine of its own. serve returns when stop is
// closed (or when it can do nothing more, the queue broken); wake receives
// a value after every Wake, coalesced.
func (w *Worker) Start(serve func(wake, stop <-chan struct{})) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done != nil {
		return ErrWorkerRunning
	}
	wake, stop, done := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	w.wake, w.stop, w.done = wake, stop, done
	go func() {
		defer close(done)
		serve(wake, stop)
	}()
	return nil
}

// Wake tells a running worker there is work; it never blocks.
func (w *Worker) Wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done == nil {
		return
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Stop closes the worker's stop channel and waits until serve returns; it
// reports whether a worker was running.
func (w *Worker) Stop() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done == nil {
		return false
	}
	close(w.stop)
	<-w.done
	w.wake, w.stop, w.done = nil, nil, nil
	return true
}
