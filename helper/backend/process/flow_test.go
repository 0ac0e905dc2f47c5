package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// TestSlowSubscriberThroughTheSandbox: the helper with this backend (the
// real agent), 32 processes printing 1 MiB each while the subscriber takes
// a pause after every event and once drops an event unwritten: every byte
// and every exit arrives, in order, the processes held back by their
// credit.
func TestSlowSubscriberThroughTheSandbox(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	h, err := helper.New(helper.Options{
		Backend: "process",
		Backends: map[string]helper.BackendFactory{"process": func() (helper.Backend, error) {
			return New(Options{Executable: exe, Env: []string{testAgentEnv + "=1"}, StopGrace: 5 * time.Second}), nil
		}},
		DataDir:      t.TempDir(),
		SystemDirs:   []string{"/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"},
		NetworkCheck: func(context.Context) string { return protocol.NetworkConnected },
	})
	require.NoError(t, err)
	defer h.Close(context.Background())
	ctx := protocol.WithConnState(context.Background())
	call := func(method string, params any) error {
		raw, err := json.Marshal(params)
		require.NoError(t, err)
		_, err = h.Call(ctx, method, raw)
		return err
	}
	require.NoError(t, call("configure", map[string]any{"userDataName": "p", "userDataRoot": "/r", "sessionOnly": true}))
	sub, err := h.Subscribe(context.Background(), json.RawMessage(`{"userDataName":"p","userDataRoot":"/r"}`))
	require.NoError(t, err)
	defer func() { sub.Cancel() }()
	err = call("startVM", map[string]any{"bundlePath": "/nonexistent"})
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC) ||
		(err != nil && strings.Contains(err.Error(), "namespace")) {
		t.Skipf("user namespaces unavailable here: %v", err)
	}
	require.NoError(t, err)

	const procs, size = 32, 1 << 20
	var ev protocol.Event
	next := func() protocol.Event {
		select {
		case ev = <-sub.Events:
			return ev
		case <-time.After(60 * time.Second):
			t.Fatal("events stopped coming")
		}
		return ev
	}
	for {
		if e := next(); e.Type == protocol.EventStartupStep && e.Status != protocol.StepStarted && e.Step == helper.StepConnectAgent {
			require.Equal(t, protocol.StepCompleted, e.Status)
			delivered(sub)
			break
		}
		delivered(sub)
	}
	for i := range procs {
		id := fmt.Sprintf("p%02d", i)
		script := fmt.Sprintf("i=0; while :; do printf '%s %%07d %%s\\n' $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done | head -c %d", id, size)
		require.NoError(t, call("spawn", map[string]any{"id": id, "name": "s" + id, "command": "sh", "args": []string{"-c", script}}))
	}
	got := map[string]*strings.Builder{}
	exits := 0
	start := time.Now()
	for n := 0; exits < procs; n++ {
		e := next()
		if n == 500 { // the connection drops with this event unwritten
			sub.Cancel()
			time.Sleep(time.Second)
			sub, err = h.Subscribe(context.Background(), json.RawMessage(`{"userDataName":"p","userDataRoot":"/r"}`))
			require.NoError(t, err)
			continue
		}
		switch e.Type {
		case protocol.EventStdout:
			if got[e.ID] == nil {
				got[e.ID] = &strings.Builder{}
			}
			got[e.ID].WriteString(e.Data)
		case protocol.EventExit:
			require.Equal(t, 0, *e.ExitCode, e.ID)
			require.Equal(t, size, got[e.ID].Len(), "process %s: all its output before its exit", e.ID)
			exits++
		}
		delivered(sub)
		time.Sleep(time.Millisecond)
	}
	total := 0
	for i := range procs {
		id := fmt.Sprintf("p%02d", i)
		out := got[id].String()
		total += len(out)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		for k, l := range lines[:len(lines)-1] { // the last is cut by head
			if l != fmt.Sprintf("%s %07d %s", id, k, strings.Repeat("x", 36)) {
				t.Fatalf("process %s, line %d: %q", id, k, l)
			}
		}
	}
	t.Logf("delivered %d of %d bytes and %d of %d exits in %v", total, procs*size, exits, procs, time.Since(start).Round(time.Millisecond))
	assert.Equal(t, procs*size, total)
}

// delivered tells sub its event was written, as the socket server does.
func delivered(sub *protocol.Subscription) {
	if sub.Delivered != nil {
		sub.Delivered()
	}
}
