package agent

import (
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// slowCloser is a connection whose Close blocks until released, as a
// lingering vsock close does until the host answers.
type slowCloser struct {
	io.ReadWriter
	release chan struct{}
	closes  atomic.Int32
}

func (c *slowCloser) Close() error {
	c.closes.Add(1)
	<-c.release
	return errors.New("closed once")
}

// TestDeliveringConnCloseWaitsForTheFirst: VMMain's Close, racing Run's,
// returns only once the one real close has ended, so the agent never
// powers off while its last reply is still leaving; the connection is
// closed once, and every caller gets that close's result.
func TestDeliveringConnCloseWaitsForTheFirst(t *testing.T) {
	inner := &slowCloser{release: make(chan struct{})}
	c := &deliveringConn{ReadWriteCloser: inner}
	results := make(chan error, 2)
	for range 2 {
		go func() { results <- c.Close() }()
	}
	select {
	case err := <-results:
		t.Fatalf("Close returned (%v) before the lingering close ended", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(inner.release)
	for range 2 {
		if err := <-results; err == nil || err.Error() != "closed once" {
			t.Errorf("Close = %v, want the real close's error", err)
		}
	}
	if n := inner.closes.Load(); n != 1 {
		t.Errorf("the connection was closed %d times, want once", n)
	}
}
