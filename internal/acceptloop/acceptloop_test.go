package acceptloop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/acceptloop/acceptlooptest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

// safetyTimeout only keeps a broken test from hanging; no assertion depends
// on it.
const safetyTimeout = 20 * time.Second

// serveInBackground runs Serve on l, sending every accepted connection to
// the returned channel.
func serveInBackground(ctx context.Context, l net.Listener, cfg Config) (<-chan net.Conn, <-chan error) {
	conns := make(chan net.Conn, 16)
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, cfg, func(c net.Conn) { conns <- c }) }()
	return conns, done
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(safetyTimeout):
		require.FailNow(t, "timed out waiting for "+what)
		panic("unreachable")
	}
}

func TestServeRetriesTransientErrorsThenServes(t *testing.T) {
	l := acceptlooptest.NewListener(
		acceptlooptest.AcceptError(syscall.EMFILE),
		acceptlooptest.AcceptError(syscall.ENFILE),
		acceptlooptest.AcceptError(syscall.ECONNABORTED),
		acceptlooptest.AcceptError(syscall.EMFILE),
	)
	logs := &ratelogtest.LogBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conns, done := serveInBackground(ctx, l, Config{Log: logs.Logger()})

	client := l.Dial()
	defer client.Close()
	server := receive(t, conns, "the connection after the failures")
	defer server.Close()
	assert.GreaterOrEqual(t, l.Accepts(), 5, "four failures, then the connection (and maybe the next, waiting)")
	assert.Contains(t, logs.String(), "too many open files")
	assert.Contains(t, logs.String(), "accept failed; retrying")

	// Still serving after the connection.
	client2 := l.Dial()
	defer client2.Close()
	receive(t, conns, "a second connection").Close()

	cancel()
	assert.NoError(t, receive(t, done, "Serve's return"), "a cancelled context is a clean stop")
	receive(t, l.Closed(), "the listener's close")
}

func TestServeStopsDuringBackoff(t *testing.T) {
	l := acceptlooptest.NewListener(acceptlooptest.AcceptError(syscall.EMFILE))
	ctx, cancel := context.WithCancel(context.Background())
	_, done := serveInBackground(ctx, l, Config{MinBackoff: time.Hour, MaxBackoff: time.Hour})
	for l.Accepts() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	assert.NoError(t, receive(t, done, "Serve's return"))
}

func TestServeLogIsRateLimited(t *testing.T) {
	errs := make([]error, 200)
	for i := range errs {
		errs[i] = acceptlooptest.AcceptError(syscall.EMFILE)
	}
	l := acceptlooptest.NewListener(errs...)
	logs := &ratelogtest.LogBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conns, done := serveInBackground(ctx, l, Config{
		Log:        logs.Logger(),
		MinBackoff: time.Microsecond, MaxBackoff: time.Microsecond,
	})
	client := l.Dial()
	defer client.Close()
	receive(t, conns, "the connection after 200 failures").Close()
	lines := strings.Count(logs.String(), "accept failed")
	assert.Positive(t, lines)
	assert.LessOrEqual(t, lines, 10, "200 failures, at most a burst of lines (the window is a minute)")
	cancel()
	require.NoError(t, receive(t, done, "Serve's return"))
}

func TestServeReturnsPermanentErrors(t *testing.T) {
	l := acceptlooptest.NewListener(acceptlooptest.AcceptError(syscall.EBADF))
	_, done := serveInBackground(context.Background(), l, Config{})
	err := receive(t, done, "Serve's return")
	assert.ErrorIs(t, err, syscall.EBADF)
	assert.Contains(t, err.Error(), "accept on acceptlooptest")
}

func TestServeReportsAListenerClosedByOthers(t *testing.T) {
	l := acceptlooptest.NewListener()
	_, done := serveInBackground(context.Background(), l, Config{})
	require.NoError(t, l.Close())
	assert.ErrorIs(t, receive(t, done, "Serve's return"), net.ErrClosed,
		"the context did not end: the caller learns that its listener went away")
}

func TestTemporary(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{acceptlooptest.AcceptError(syscall.EMFILE), true},
		{acceptlooptest.AcceptError(syscall.ENFILE), true},
		{acceptlooptest.AcceptError(syscall.ECONNABORTED), true},
		{acceptlooptest.AcceptError(syscall.ENOBUFS), true},
		{fmt.Errorf("wrapped: %w", syscall.EMFILE), true},
		{&net.OpError{Op: "accept", Err: timeoutError{}}, true},
		{acceptlooptest.AcceptError(syscall.EBADF), false},
		{acceptlooptest.AcceptError(syscall.EINVAL), false},
		{&net.OpError{Op: "accept", Err: net.ErrClosed}, false},
		{errors.New("something else"), false},
	} {
		assert.Equal(t, tc.want, Temporary(tc.err), "%v", tc.err)
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func TestNextBackoff(t *testing.T) {
	lo, hi := 5*time.Millisecond, time.Second
	var got []time.Duration
	b := time.Duration(0)
	for range 10 {
		b = nextBackoff(b, lo, hi)
		got = append(got, b)
	}
	assert.Equal(t, []time.Duration{
		5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond,
		80 * time.Millisecond, 160 * time.Millisecond, 320 * time.Millisecond, 640 * time.Millisecond,
		time.Second, time.Second,
	}, got)
}
