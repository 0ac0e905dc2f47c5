package bench

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// runningHandler answers isRunning {running:false} and nothing else: the
// benchmarks time the socket server, the framing and the JSON, not the
// helper.
type runningHandler struct{}

func (runningHandler) Handle(_ context.Context, method string, _ json.RawMessage) (any, error) {
	if method != protocol.MethodIsRunning {
		return nil, protocol.UnknownMethodError(method)
	}
	return protocol.IsRunningResult{Running: false}, nil
}

func (runningHandler) Subscribe(context.Context, json.RawMessage) (*protocol.Subscription, error) {
	return nil, errors.New("no events here")
}

// serveTrivial serves runningHandler on a socket in a private directory
// and returns its path.
func serveTrivial(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "run", "bench.sock")
	ln, err := protocol.Listen(path, slog.New(slog.DiscardHandler))
	require.NoError(tb, err)
	srv := protocol.NewServer(protocol.ServerConfig{Handler: runningHandler{}, Logger: slog.New(slog.DiscardHandler)})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		_ = srv.Close()
		_ = ln.Close()
		<-done
	})
	return path
}

// BenchmarkOneShotIsRunning is the client's most frequent call as it makes
// it: dial, one request without id, half-close, reply, close.
func BenchmarkOneShotIsRunning(b *testing.B) {
	path := serveTrivial(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := protocol.CallOneShot(ctx, path, protocol.MethodIsRunning, nil)
		if err != nil || !resp.Success {
			b.Fatalf("isRunning: %v %+v", err, resp)
		}
	}
}

// BenchmarkPipeIsRunning is one request and its reply on an open
// persistent pipe (how the client polls isGuestConnected).
func BenchmarkPipeIsRunning(b *testing.B) {
	path := serveTrivial(b)
	ctx := context.Background()
	pipe, err := protocol.DialPipe(ctx, path)
	require.NoError(b, err)
	defer pipe.Close()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := pipe.Call(ctx, protocol.MethodIsRunning, nil)
		if err != nil || !resp.Success {
			b.Fatalf("isRunning: %v %+v", err, resp)
		}
	}
}

// TestTrivialServerAnswers keeps the benchmarks honest: the round trip
// they time returns the real reply.
func TestTrivialServerAnswers(t *testing.T) {
	path := serveTrivial(t)
	resp, err := protocol.CallOneShot(context.Background(), path, protocol.MethodIsRunning, nil)
	require.NoError(t, err)
	require.True(t, resp.Success)
	require.JSONEq(t, `{"running":false}`, string(resp.Result))
	resp, err = protocol.CallOneShot(context.Background(), path, "nope", nil)
	require.NoError(t, err)
	require.False(t, resp.Success)
	require.Contains(t, resp.Error, "Unknown method: nope")
}
