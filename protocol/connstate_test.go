package protocol

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A pipe's calls share one ConnState; another pipe and a one-shot
// connection each have their own, empty.
func TestConnStateIsPerConnection(t *testing.T) {
	h := &fakeHandler{handle: func(ctx context.Context, method string, params json.RawMessage) (any, error) {
		state := ConnStateFrom(ctx)
		if state == nil {
			return map[string]any{"state": "none"}, nil
		}
		if method == MethodConfigure {
			var p ConfigureParams
			_ = json.Unmarshal(params, &p)
			state.Set(p.UserDataName)
		}
		got, _ := state.Get().(string)
		return map[string]any{"state": got}, nil
	}}
	ts := startServer(t, h, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	defer cancel()
	result := func(r Response, err error) string {
		t.Helper()
		require.NoError(t, err)
		require.True(t, r.Success, r.Error)
		var v struct{ State string }
		require.NoError(t, json.Unmarshal(r.Result, &v))
		return v.State
	}

	a, err := DialPipe(ctx, ts.path)
	require.NoError(t, err)
	defer a.Close()
	b, err := DialPipe(ctx, ts.path)
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, "", result(a.Call(ctx, MethodIsRunning, nil)), "nothing set yet")
	assert.Equal(t, "A", result(a.Call(ctx, MethodConfigure, ConfigureParams{UserDataName: "A"})))
	assert.Equal(t, "A", result(a.Call(ctx, MethodIsRunning, nil)), "the pipe's later calls see it")
	assert.Equal(t, "", result(b.Call(ctx, MethodIsRunning, nil)), "another pipe does not")
	assert.Equal(t, "", result(CallOneShot(ctx, ts.path, MethodIsRunning, nil)), "nor a one-shot call")
	assert.Nil(t, ConnStateFrom(context.Background()), "no state outside the server")
	assert.NotNil(t, ConnStateFrom(WithConnState(context.Background())))
}
