package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// guestFake answers the boot methods: the guest connects after connectAfter
// polls, or stops (isRunning false) when dies is set.
type guestFake struct {
	mu           sync.Mutex
	calls        []string
	running      bool
	dies         bool
	connectAfter int
	polls        int
}

func (g *guestFake) handler() *fakeHandler {
	return &fakeHandler{handle: func(_ context.Context, method string, params json.RawMessage) (any, error) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.calls = append(g.calls, method)
		switch method {
		case MethodConfigure:
			p, err := DecodeParams[ConfigureParams](method, params)
			if err != nil {
				return nil, err
			}
			if p.SessionOnly {
				return nil, errors.New("StartGuest must send the full configure")
			}
		case MethodIsRunning:
			return IsRunningResult{Running: g.running}, nil
		case MethodStartVM:
			g.running = !g.dies
		case MethodIsGuestConnected:
			g.polls++
			return IsGuestConnectedResult{Connected: g.running && g.polls > g.connectAfter}, nil
		case MethodSpawn:
			return nil, errors.New("no such command")
		}
		return nil, nil
	}}
}

func (g *guestFake) methods() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.calls...)
}

func dialFake(t *testing.T, g *guestFake) *PipeClient {
	t.Helper()
	ts := startServer(t, g.handler(), ServerConfig{})
	p, err := DialPipe(t.Context(), ts.path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestCallResult(t *testing.T) {
	p := dialFake(t, &guestFake{running: true})
	var r IsRunningResult
	require.NoError(t, p.CallResult(t.Context(), MethodIsRunning, nil, &r))
	assert.True(t, r.Running)

	err := p.CallResult(t.Context(), MethodSpawn, ClientSpawnParams{ID: "x"}, nil)
	var reply *ReplyError
	require.ErrorAs(t, err, &reply)
	assert.Equal(t, &ReplyError{Method: MethodSpawn, Message: "no such command"}, reply)
	assert.Equal(t, "spawn: no such command", err.Error())

	err = p.CallResult(t.Context(), "frobnicate", nil, nil)
	require.ErrorAs(t, err, &reply)
	assert.Equal(t, "Unknown method: frobnicate", reply.Message)
}

func TestStartGuestBootsAndWaits(t *testing.T) {
	g := &guestFake{connectAfter: 3}
	p := dialFake(t, g)
	started, err := StartGuest(t.Context(), p, ConfigureParams{UserDataName: "u", SessionOnly: true}, StartVMParams{})
	require.NoError(t, err)
	assert.True(t, started)
	assert.Equal(t, []string{MethodIsRunning, MethodConfigure, MethodStartVM}, g.methods())

	require.NoError(t, WaitGuestConnected(t.Context(), p, time.Millisecond))
	g.mu.Lock()
	assert.Equal(t, 4, g.polls, "polled until the fourth answer said connected")
	g.mu.Unlock()
}

func TestStartGuestLeavesARunningGuestAlone(t *testing.T) {
	g := &guestFake{running: true}
	p := dialFake(t, g)
	started, err := StartGuest(t.Context(), p, ConfigureParams{}, StartVMParams{})
	require.NoError(t, err)
	assert.False(t, started)
	assert.Equal(t, []string{MethodIsRunning}, g.methods())
}

func TestWaitGuestConnectedFailures(t *testing.T) {
	g := &guestFake{dies: true}
	p := dialFake(t, g)
	_, err := StartGuest(t.Context(), p, ConfigureParams{}, StartVMParams{})
	require.NoError(t, err)
	assert.ErrorIs(t, WaitGuestConnected(t.Context(), p, time.Millisecond), ErrGuestStopped)

	// A guest that never connects: the context's end is the answer.
	g = &guestFake{running: true, connectAfter: 1 << 30}
	p = dialFake(t, g)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	assert.ErrorIs(t, WaitGuestConnected(ctx, p, time.Millisecond), context.Canceled)
}
