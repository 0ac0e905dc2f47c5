package agentrpc

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

func pipeWithAgentWriting(t *testing.T, frames ...[]byte) net.Conn {
	t.Helper()
	helperEnd, agentEnd := net.Pipe()
	t.Cleanup(func() { helperEnd.Close(); agentEnd.Close() })
	go func() {
		for _, f := range frames {
			if protocol.WriteFrame(agentEnd, f) != nil {
				return
			}
		}
		// Then read (and drop) whatever the helper sends, like a silent agent.
		buf := make([]byte, 4096)
		for {
			if _, err := agentEnd.Read(buf); err != nil {
				return
			}
		}
	}()
	return helperEnd
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestDialAgentRefusesBadHello(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for name, frame := range map[string][]byte{
		"not JSON":      []byte(`{hello`),
		"not a hello":   mustJSON(t, protocol.AgentFrame{Kind: protocol.AgentKindEvent}),
		"hello no body": mustJSON(t, protocol.AgentFrame{Kind: protocol.AgentKindHello}),
		"wrong version": mustJSON(t, protocol.AgentFrame{Kind: protocol.AgentKindHello, Hello: &protocol.AgentHello{Version: 99}}),
	} {
		_, err := Dial(context.Background(), pipeWithAgentWriting(t, frame), log, nil)
		assert.Error(t, err, name)
	}
}

func TestAgentClientFailsPendingCallsWhenTheAgentMisbehaves(t *testing.T) {
	hello := mustJSON(t, protocol.AgentFrame{Kind: protocol.AgentKindHello, Hello: &protocol.AgentHello{Version: protocol.AgentProtocolVersion}})
	helperEnd, agentEnd := net.Pipe()
	defer agentEnd.Close()
	go func() {
		_ = protocol.WriteFrame(agentEnd, hello)
		_, _ = protocol.ReadFrame(agentEnd) // the ping request
		_ = protocol.WriteFrame(agentEnd, []byte(`not json`))
	}()
	c, err := Dial(context.Background(), helperEnd, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	err = c.Call(context.Background(), protocol.AgentMethodPing, nil, nil)
	require.ErrorIs(t, err, ErrGone)
	<-c.Done()
	require.ErrorIs(t, c.Err(), ErrGone)
	require.ErrorIs(t, c.Call(context.Background(), protocol.AgentMethodPing, nil, nil), ErrGone, "later calls fail at once")
}

func TestAgentClientRepliesAndEvents(t *testing.T) {
	hello := mustJSON(t, protocol.AgentFrame{Kind: protocol.AgentKindHello, Hello: &protocol.AgentHello{Version: protocol.AgentProtocolVersion}})
	helperEnd, agentEnd := net.Pipe()
	defer agentEnd.Close()
	go func() {
		_ = protocol.WriteFrame(agentEnd, hello)
		body, err := protocol.ReadFrame(agentEnd)
		if err != nil {
			return
		}
		var req protocol.AgentFrame
		_ = json.Unmarshal(body, &req)
		_ = protocol.WriteJSON(agentEnd, protocol.AgentFrame{Kind: protocol.AgentKindReply, ID: req.ID + 100}) // unknown id: ignored
		_ = protocol.WriteJSON(agentEnd, protocol.AgentFrame{Kind: protocol.AgentKindEvent, Event: &protocol.Event{Type: "stdout", ID: "x", Data: "hi"}})
		_ = protocol.WriteJSON(agentEnd, protocol.AgentFrame{Kind: protocol.AgentKindReply, ID: req.ID,
			Result: mustJSON(t, protocol.ReadFileResult{Content: []byte("abc")})})
	}()
	events := make(chan protocol.Event, 1)
	c, err := Dial(context.Background(), helperEnd, slog.New(slog.DiscardHandler), func(ev protocol.Event) { events <- ev })
	require.NoError(t, err)
	defer c.Close()
	var r protocol.ReadFileResult
	require.NoError(t, c.Call(context.Background(), protocol.AgentMethodReadFile, protocol.ReadFileParams{Path: "/x"}, &r))
	assert.Equal(t, []byte("abc"), r.Content)
	assert.Equal(t, "hi", (<-events).Data)
}
