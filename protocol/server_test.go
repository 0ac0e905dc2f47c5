package protocol

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// safetyTimeout only keeps a broken test from hanging; no assertion depends
// on it.
const safetyTimeout = 20 * time.Second

// fakeHandler routes calls to per-test functions.
type fakeHandler struct {
	handle    func(ctx context.Context, method string, params json.RawMessage) (any, error)
	subscribe func(ctx context.Context, params json.RawMessage) (*Subscription, error)
}

func (f *fakeHandler) Handle(ctx context.Context, method string, params json.RawMessage) (any, error) {
	if f.handle == nil {
		return nil, nil
	}
	return f.handle(ctx, method, params)
}

func (f *fakeHandler) Subscribe(ctx context.Context, params json.RawMessage) (*Subscription, error) {
	if f.subscribe == nil {
		return nil, errors.New("no subscriptions here")
	}
	return f.subscribe(ctx, params)
}

// lockedBuffer collects log output from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// shortTempDir returns a private temp dir with a short path (Unix socket
// paths are limited to 108 bytes; t.TempDir embeds the test name).
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cvp")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

type testServer struct {
	path string
	srv  *Server
	logs *lockedBuffer
	done chan error
}

func startServer(t *testing.T, h Handler, cfg ServerConfig) *testServer {
	t.Helper()
	ts := &testServer{path: filepath.Join(shortTempDir(t), "run", "h.sock"), logs: &lockedBuffer{}, done: make(chan error, 1)}
	logger := slog.New(slog.NewTextHandler(ts.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l, err := Listen(ts.path, logger)
	require.NoError(t, err)
	cfg.Handler = h
	cfg.Logger = logger
	ts.srv = NewServer(cfg)
	go func() { ts.done <- ts.srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
		defer cancel()
		assert.NoError(t, ts.srv.Shutdown(ctx))
		assert.ErrorIs(t, <-ts.done, ErrServerClosed)
	})
	return ts
}

func (ts *testServer) dial(t *testing.T) *net.UnixConn {
	t.Helper()
	c, err := net.Dial("unix", ts.path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(safetyTimeout))
	return c.(*net.UnixConn)
}

func sendRaw(t *testing.T, c net.Conn, body string) {
	t.Helper()
	require.NoError(t, WriteFrame(c, []byte(body)))
}

// recvJSON reads one frame and returns it as a generic map (to check exact
// wire shapes) along with the decoded Response.
func recvJSON(t *testing.T, c net.Conn) (map[string]any, Response) {
	t.Helper()
	body, err := ReadFrame(c)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(body, &m), "reply is JSON: %s", body)
	var r Response
	_ = json.Unmarshal(body, &r) // events and odd ids are not Responses
	return m, r
}

func assertClosedByServer(t *testing.T, c net.Conn) {
	t.Helper()
	_, err := ReadFrame(c)
	assert.ErrorIs(t, err, io.EOF, "server closes the connection")
}

func TestOneShot(t *testing.T) {
	ts := startServer(t, &fakeHandler{handle: func(_ context.Context, method string, _ json.RawMessage) (any, error) {
		require.Equal(t, MethodIsRunning, method)
		return IsRunningResult{Running: false}, nil
	}}, ServerConfig{})

	c := ts.dial(t)
	sendRaw(t, c, `{"method":"isRunning"}`)
	require.NoError(t, c.CloseWrite(), "the client half-closes after its request")
	m, _ := recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": true, "result": map[string]any{"running": false}}, m)
	assertClosedByServer(t, c)

	// The client helper does the same.
	resp, err := CallOneShot(context.Background(), ts.path, MethodIsRunning, nil)
	require.NoError(t, err)
	assert.True(t, resp.Success)
	assert.JSONEq(t, `{"running":false}`, string(resp.Result))
	assert.Nil(t, resp.ID)
}

func TestOneShotWithoutHalfClose(t *testing.T) {
	ts := startServer(t, &fakeHandler{}, ServerConfig{})
	c := ts.dial(t)
	sendRaw(t, c, `{"method":"stopVM"}`)
	m, _ := recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": true}, m, "a nil result leaves result out")
	assertClosedByServer(t, c)
}

func TestHandlerErrorReply(t *testing.T) {
	ts := startServer(t, &fakeHandler{handle: func(context.Context, string, json.RawMessage) (any, error) {
		return nil, fmt.Errorf("start failed: %w", os.ErrPermission)
	}}, ServerConfig{})
	c := ts.dial(t)
	sendRaw(t, c, `{"method":"startVM","id":5}`)
	m, _ := recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": false, "error": "start failed: permission denied", "id": float64(5)}, m)
}

func TestPipeOutOfOrderReplies(t *testing.T) {
	release := make(chan struct{})
	slowStarted := make(chan struct{})
	ts := startServer(t, &fakeHandler{handle: func(ctx context.Context, method string, _ json.RawMessage) (any, error) {
		switch method {
		case MethodStartVM:
			close(slowStarted)
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return nil, nil
		case MethodIsGuestConnected:
			return IsGuestConnectedResult{Connected: false}, nil
		}
		return nil, nil
	}}, ServerConfig{})

	c := ts.dial(t)
	sendRaw(t, c, `{"method":"startVM","id":1,"params":{"bundlePath":"/b"}}`)
	<-slowStarted
	sendRaw(t, c, `{"method":"isGuestConnected","id":2}`)
	m, _ := recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": true, "result": map[string]any{"connected": false}, "id": float64(2)}, m,
		"the fast call answers while the slow one is still running")
	close(release)
	m, _ = recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": true, "id": float64(1)}, m)
}

func TestPipeClientConcurrentCalls(t *testing.T) {
	ts := startServer(t, &fakeHandler{handle: func(_ context.Context, _ string, params json.RawMessage) (any, error) {
		p, err := DecodeParams[IsProcessRunningParams](MethodIsProcessRunning, params)
		if err != nil {
			return nil, err
		}
		code := len(p.ID)
		return IsProcessRunningResult{Running: false, ExitCode: &code}, nil
	}}, ServerConfig{MaxInFlight: 4})

	p, err := DialPipe(context.Background(), ts.path)
	require.NoError(t, err)
	defer p.Close()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := string(bytes.Repeat([]byte("x"), i))
			resp, err := p.Call(context.Background(), MethodIsProcessRunning, IsProcessRunningParams{ID: id})
			if assert.NoError(t, err) && assert.True(t, resp.Success) {
				assert.JSONEq(t, fmt.Sprintf(`{"running":false,"exitCode":%d}`, i), string(resp.Result))
			}
		}()
	}
	wg.Wait()
}

func TestPipeInFlightBound(t *testing.T) {
	const limit = 3
	var mu sync.Mutex
	running, peak := 0, 0
	entered := make(chan struct{}, 100)
	release := make(chan struct{})
	ts := startServer(t, &fakeHandler{handle: func(ctx context.Context, _ string, _ json.RawMessage) (any, error) {
		mu.Lock()
		running++
		peak = max(peak, running)
		mu.Unlock()
		entered <- struct{}{}
		<-release
		mu.Lock()
		running--
		mu.Unlock()
		return nil, nil
	}}, ServerConfig{MaxInFlight: limit})

	c := ts.dial(t)
	for i := 1; i <= 10; i++ {
		sendRaw(t, c, fmt.Sprintf(`{"method":"stopVM","id":%d}`, i))
	}
	for range limit {
		<-entered
	}
	close(release)
	seen := map[uint64]bool{}
	for range 10 {
		_, r := recvJSON(t, c)
		require.NotNil(t, r.ID)
		seen[*r.ID] = true
	}
	assert.Len(t, seen, 10)
	mu.Lock()
	defer mu.Unlock()
	assert.LessOrEqual(t, peak, limit)
}

func TestPipeHalfCloseStillGetsReplies(t *testing.T) {
	release := make(chan struct{})
	ts := startServer(t, &fakeHandler{handle: func(context.Context, string, json.RawMessage) (any, error) {
		<-release
		return IsRunningResult{Running: true}, nil
	}}, ServerConfig{})
	c := ts.dial(t)
	sendRaw(t, c, `{"method":"isRunning","id":1}`)
	require.NoError(t, c.CloseWrite())
	close(release)
	m, _ := recvJSON(t, c)
	assert.Equal(t, true, m["success"])
	assertClosedByServer(t, c)
}

func TestPipeClientGoneCancelsCalls(t *testing.T) {
	cancelled := make(chan struct{})
	started := make(chan struct{})
	ts := startServer(t, &fakeHandler{handle: func(ctx context.Context, _ string, _ json.RawMessage) (any, error) {
		close(started)
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	}}, ServerConfig{})
	c := ts.dial(t)
	sendRaw(t, c, `{"method":"startVM","id":1}`)
	<-started
	require.NoError(t, c.Close())
	select {
	case <-cancelled:
	case <-time.After(safetyTimeout):
		t.Fatal("handler context was not cancelled after the client closed")
	}
}

func TestSubscriptionAckFirstThenEvents(t *testing.T) {
	events := make(chan Event, 4)
	cancelled := make(chan struct{})
	gotParams := make(chan SubscribeEventsParams, 1)
	ts := startServer(t, &fakeHandler{subscribe: func(_ context.Context, params json.RawMessage) (*Subscription, error) {
		p, err := DecodeParams[SubscribeEventsParams](MethodSubscribeEvents, params)
		if err != nil {
			return nil, err
		}
		gotParams <- p
		// Events already queued before the ack must still come after it.
		events <- Event{Type: EventNetworkStatus, Status: NetworkConnected}
		return &Subscription{Events: events, Cancel: func() { close(cancelled) }}, nil
	}}, ServerConfig{})

	c := ts.dial(t)
	sendRaw(t, c, `{"method":"subscribeEvents","params":{"userDataName":"Claude","userDataRoot":"/home/u/.config/Claude"}}`)
	m, _ := recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": true}, m, "ack first, exactly {success:true}")
	assert.Equal(t, SubscribeEventsParams{UserDataName: "Claude", UserDataRoot: "/home/u/.config/Claude"}, <-gotParams)

	m, _ = recvJSON(t, c)
	assert.Equal(t, map[string]any{"type": "networkStatus", "status": "CONNECTED"}, m)
	code := 0
	events <- Event{Type: EventExit, ID: "p1", ExitCode: &code}
	m, _ = recvJSON(t, c)
	assert.Equal(t, map[string]any{"type": "exit", "id": "p1", "exitCode": float64(0)}, m)

	require.NoError(t, c.Close())
	select {
	case <-cancelled:
	case <-time.After(safetyTimeout):
		t.Fatal("subscription was not cancelled after the client closed")
	}
}

func TestSubscriptionSurvivesClientHalfClose(t *testing.T) {
	events := make(chan Event, 1)
	ts := startServer(t, &fakeHandler{subscribe: func(context.Context, json.RawMessage) (*Subscription, error) {
		return &Subscription{Events: events}, nil
	}}, ServerConfig{})
	c := ts.dial(t)
	sendRaw(t, c, `{"method":"subscribeEvents","params":{}}`)
	_, ack := recvJSON(t, c)
	require.True(t, ack.Success)
	require.NoError(t, c.CloseWrite())
	events <- Event{Type: EventStdout, ID: "p", Data: "hi"}
	m, _ := recvJSON(t, c)
	assert.Equal(t, map[string]any{"type": "stdout", "id": "p", "data": "hi"}, m)
}

func TestSubscriptionProducerEndCloses(t *testing.T) {
	events := make(chan Event)
	ts := startServer(t, &fakeHandler{subscribe: func(context.Context, json.RawMessage) (*Subscription, error) {
		return &Subscription{Events: events}, nil
	}}, ServerConfig{})
	s, err := SubscribeEvents(context.Background(), ts.path, SubscribeEventsParams{UserDataName: "a"})
	require.NoError(t, err)
	defer s.Close()
	events <- Event{Type: EventStartupStep, Step: "boot", Status: StepStarted}
	ev, err := s.Next()
	require.NoError(t, err)
	assert.Equal(t, Event{Type: EventStartupStep, Step: "boot", Status: StepStarted}, ev)
	close(events)
	_, err = s.Next()
	assert.ErrorIs(t, err, io.EOF)
}

func TestSubscriptionRefused(t *testing.T) {
	ts := startServer(t, &fakeHandler{}, ServerConfig{})
	c := ts.dial(t)
	sendRaw(t, c, `{"method":"subscribeEvents","id":4}`)
	m, _ := recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": false, "error": "no subscriptions here", "id": float64(4)}, m)
	assertClosedByServer(t, c)
}

func TestSubscribeOnPipeRefused(t *testing.T) {
	ts := startServer(t, &fakeHandler{}, ServerConfig{})
	c := ts.dial(t)
	sendRaw(t, c, `{"method":"stopVM","id":1}`)
	recvJSON(t, c)
	sendRaw(t, c, `{"method":"subscribeEvents","id":2}`)
	_, r := recvJSON(t, c)
	assert.False(t, r.Success)
	assert.Contains(t, r.Error, "own connection")
	sendRaw(t, c, `{"method":"stopVM","id":3}`)
	_, r = recvJSON(t, c)
	assert.True(t, r.Success, "the pipe keeps serving")
}

func TestInvalidJSONKeepsServing(t *testing.T) {
	ts := startServer(t, &fakeHandler{handle: func(context.Context, string, json.RawMessage) (any, error) {
		return IsRunningResult{}, nil
	}}, ServerConfig{})

	// Without a readable id, as the first frame: error without id.
	c := ts.dial(t)
	sendRaw(t, c, `{this is not json`)
	m, _ := recvJSON(t, c)
	assert.Equal(t, false, m["success"])
	assert.NotEmpty(t, m["error"])
	assert.NotContains(t, m, "id")
	// Then the connection is still usable (and its mode still open).
	sendRaw(t, c, `{"method":"isRunning","id":1}`)
	m, _ = recvJSON(t, c)
	assert.Equal(t, float64(1), m["id"])
	assert.Equal(t, true, m["success"])

	// With a readable id, on an established pipe.
	sendRaw(t, c, `{"id":2,"method":"isRunning","params":{`)
	m, _ = recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": false, "error": m["error"], "id": float64(2)}, m)
	assert.Contains(t, m["error"], "invalid request")

	// A non-numeric id is echoed as sent.
	sendRaw(t, c, `{"id":"x7","method":"isRunning"}`)
	m, _ = recvJSON(t, c)
	assert.Equal(t, "x7", m["id"])
	assert.Equal(t, false, m["success"])

	sendRaw(t, c, `{"method":"isRunning","id":3}`)
	m, _ = recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": true, "result": map[string]any{"running": false}, "id": float64(3)}, m)
}

func TestUnknownMethod(t *testing.T) {
	called := false
	var mu sync.Mutex
	ts := startServer(t, &fakeHandler{handle: func(_ context.Context, method string, _ json.RawMessage) (any, error) {
		mu.Lock()
		called = true
		mu.Unlock()
		if method == MethodInstallSdk {
			return nil, fmt.Errorf("not yet: %w", ErrUnknownMethod)
		}
		return nil, nil
	}}, ServerConfig{})

	resp, err := CallOneShot(context.Background(), ts.path, "getMemoryTier", nil)
	require.NoError(t, err)
	assert.Equal(t, Response{Success: false, Error: "Unknown method: getMemoryTier"}, resp)
	mu.Lock()
	assert.False(t, called, "the handler never sees methods outside the contract")
	mu.Unlock()

	resp, err = CallOneShot(context.Background(), ts.path, MethodInstallSdk, nil)
	require.NoError(t, err)
	assert.Equal(t, "Unknown method: installSdk", resp.Error, "ErrUnknownMethod from the handler gets the exact wording")
}

func TestOversizedFrameClosesOnlyThatConnection(t *testing.T) {
	ts := startServer(t, &fakeHandler{handle: func(context.Context, string, json.RawMessage) (any, error) {
		return IsRunningResult{Running: true}, nil
	}}, ServerConfig{})

	good := ts.dial(t)
	sendRaw(t, good, `{"method":"isRunning","id":1}`)
	recvJSON(t, good)

	bad := ts.dial(t)
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxFrameSize+1)
	_, err := bad.Write(hdr[:])
	require.NoError(t, err)
	m, _ := recvJSON(t, bad)
	assert.Equal(t, false, m["success"])
	assert.Contains(t, m["error"], "10 MiB")
	assertClosedByServer(t, bad)

	sendRaw(t, good, `{"method":"isRunning","id":2}`)
	m, _ = recvJSON(t, good)
	assert.Equal(t, float64(2), m["id"])
	assert.Equal(t, true, m["success"])

	resp, err := CallOneShot(context.Background(), ts.path, MethodIsRunning, nil)
	require.NoError(t, err)
	assert.True(t, resp.Success, "new connections are still served")
	assert.Contains(t, ts.logs.String(), "oversized frame")
}

func TestHandlerPanicIsAnErrorReply(t *testing.T) {
	ts := startServer(t, &fakeHandler{
		handle: func(_ context.Context, method string, _ json.RawMessage) (any, error) {
			if method == MethodSpawn {
				var m map[string]int
				m["boom"]++ // nil map write
			}
			return nil, nil
		},
		subscribe: func(context.Context, json.RawMessage) (*Subscription, error) { panic("sub boom") },
	}, ServerConfig{})

	resp, err := CallOneShot(context.Background(), ts.path, MethodSpawn, nil)
	require.NoError(t, err)
	assert.False(t, resp.Success)
	assert.Contains(t, resp.Error, "internal error in spawn")

	c := ts.dial(t)
	sendRaw(t, c, `{"method":"subscribeEvents"}`)
	_, r := recvJSON(t, c)
	assert.False(t, r.Success)
	assert.Contains(t, r.Error, "sub boom")

	resp, err = CallOneShot(context.Background(), ts.path, MethodStopVM, nil)
	require.NoError(t, err)
	assert.True(t, resp.Success, "the server survives")
	assert.Contains(t, ts.logs.String(), "handler panicked")
}

func TestResultTooLargeBecomesError(t *testing.T) {
	ts := startServer(t, &fakeHandler{handle: func(context.Context, string, json.RawMessage) (any, error) {
		return strings.Repeat("a", MaxFrameSize), nil // with the envelope, past the cap
	}}, ServerConfig{})
	resp, err := CallOneShot(context.Background(), ts.path, MethodReadFile, nil)
	require.NoError(t, err)
	assert.False(t, resp.Success)
	assert.Contains(t, resp.Error, "exceeds the 10 MiB frame limit")
}

func TestShutdownClosesEverything(t *testing.T) {
	h := &fakeHandler{
		handle: func(ctx context.Context, _ string, _ json.RawMessage) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		subscribe: func(ctx context.Context, _ json.RawMessage) (*Subscription, error) {
			return &Subscription{Events: make(chan Event)}, nil
		},
	}
	path := filepath.Join(shortTempDir(t), "s.sock")
	l, err := Listen(path, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	srv := NewServer(ServerConfig{Handler: h, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()

	sub, err := SubscribeEvents(context.Background(), path, nil)
	require.NoError(t, err)
	defer sub.Close()
	pipe, err := DialPipe(context.Background(), path)
	require.NoError(t, err)
	defer pipe.Close()
	callErr := make(chan error, 1)
	go func() {
		_, err := pipe.Call(context.Background(), MethodStartVM, nil)
		callErr <- err
	}()

	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))
	assert.ErrorIs(t, <-done, ErrServerClosed)
	_, err = sub.Next()
	assert.Error(t, err, "subscription ended")
	// The pending call ends one way or another (reply or closed pipe).
	<-callErr
	_, err = os.Lstat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "socket removed")
	assert.ErrorIs(t, srv.Serve(l), ErrServerClosed, "Serve after Shutdown")
}

func TestMaxConns(t *testing.T) {
	ts := startServer(t, &fakeHandler{}, ServerConfig{MaxConns: 1})
	first := ts.dial(t)
	sendRaw(t, first, `{"method":"stopVM","id":1}`)
	recvJSON(t, first) // the first connection is now registered
	second := ts.dial(t)
	_, err := ReadFrame(second)
	assert.Error(t, err, "a connection over the limit is closed at once")
	sendRaw(t, first, `{"method":"stopVM","id":2}`)
	_, r := recvJSON(t, first)
	assert.True(t, r.Success)
}

func TestDebugLoggingPerFrame(t *testing.T) {
	ts := startServer(t, &fakeHandler{}, ServerConfig{})
	_, err := CallOneShot(context.Background(), ts.path, MethodStopVM, nil)
	require.NoError(t, err)
	assert.NotContains(t, ts.logs.String(), "method=stopVM", "quiet by default")
	ts.srv.SetDebug(true)
	_, err = CallOneShot(context.Background(), ts.path, MethodIsRunning, nil)
	require.NoError(t, err)
	assert.Contains(t, ts.logs.String(), "method=isRunning")
}

func TestSubscriptionAckCarriesID(t *testing.T) {
	ts := startServer(t, &fakeHandler{subscribe: func(context.Context, json.RawMessage) (*Subscription, error) {
		return &Subscription{Events: make(chan Event)}, nil
	}}, ServerConfig{})
	c := ts.dial(t)
	sendRaw(t, c, `{"method":"subscribeEvents","id":11}`)
	m, _ := recvJSON(t, c)
	assert.Equal(t, map[string]any{"success": true, "id": float64(11)}, m)
}

// Delivered is called once per event, after its frame is written: never
// for an event whose write failed.
func TestSubscriptionDeliveredAfterWrite(t *testing.T) {
	events := make(chan Event)
	delivered := make(chan struct{}, 8)
	ts := startServer(t, &fakeHandler{subscribe: func(context.Context, json.RawMessage) (*Subscription, error) {
		return &Subscription{Events: events, Delivered: func() { delivered <- struct{}{} }}, nil
	}}, ServerConfig{})
	c := ts.dial(t)
	sendRaw(t, c, `{"method":"subscribeEvents","params":{}}`)
	_, ack := recvJSON(t, c)
	require.True(t, ack.Success)
	events <- Event{Type: EventStdout, ID: "p", Data: "one"}
	m, _ := recvJSON(t, c)
	assert.Equal(t, "one", m["data"])
	select {
	case <-delivered:
	case <-time.After(safetyTimeout):
		t.Fatal("a written event was not reported delivered")
	}
	require.NoError(t, c.Close())
	// The server notices the close; a later event cannot be written.
	select {
	case events <- Event{Type: EventStdout, ID: "p", Data: "two"}:
	case <-time.After(time.Second): // the server stopped reading already
	}
	time.Sleep(50 * time.Millisecond)
	assert.Empty(t, delivered, "an event not written is not delivered")
}
