package protocol

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func agentPair(t *testing.T) (*AgentConn, *AgentConn) {
	t.Helper()
	a, b := net.Pipe()
	ca, cb := NewAgentConn(a), NewAgentConn(b)
	t.Cleanup(func() {
		_ = ca.Close()
		_ = cb.Close()
	})
	return ca, cb
}

func TestAgentConnRoundTrip(t *testing.T) {
	helper, agent := agentPair(t)
	code := 3
	frames := []AgentFrame{
		{Kind: AgentKindHello, Hello: &AgentHello{Version: AgentProtocolVersion, PID: 1, Kernel: "6.1"}},
		{Kind: AgentKindRequest, ID: 1, Method: AgentMethodSpawn, Params: json.RawMessage(`{"id":"p","command":"/bin/true","cwd":"/","env":[]}`)},
		{Kind: AgentKindReply, ID: 1},
		{Kind: AgentKindReply, ID: 2, Error: "no such file"},
		{Kind: AgentKindEvent, Event: &Event{Type: EventExit, ID: "p", ExitCode: &code}},
	}
	go func() {
		for _, f := range frames {
			if err := agent.WriteFrame(f); err != nil {
				return
			}
		}
	}()
	for _, want := range frames {
		got, err := helper.ReadFrame()
		require.NoError(t, err)
		if want.Params != nil {
			assert.JSONEq(t, string(want.Params), string(got.Params))
			got.Params, want.Params = nil, nil
		}
		assert.Equal(t, want, got)
	}
}

func TestAgentConnConcurrentWritersDoNotInterleave(t *testing.T) {
	helper, agent := agentPair(t)
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				data := string(make([]byte, 1000+w*10+i))
				if !assert.NoError(t, agent.WriteFrame(AgentFrame{Kind: AgentKindEvent, Event: &Event{Type: EventStdout, ID: "p", Data: data}})) {
					return
				}
			}
		}()
	}
	for range writers * each {
		f, err := helper.ReadFrame()
		require.NoError(t, err)
		require.Equal(t, EventStdout, f.Event.Type)
	}
	wg.Wait()
}

func TestAgentFrameValidate(t *testing.T) {
	bad := []AgentFrame{
		{},
		{Kind: "bogus"},
		{Kind: AgentKindHello},
		{Kind: AgentKindRequest, Method: "ping"},
		{Kind: AgentKindRequest, ID: 1},
		{Kind: AgentKindReply},
		{Kind: AgentKindEvent},
		{Kind: AgentKindEvent, Event: &Event{}},
	}
	for _, f := range bad {
		assert.ErrorIs(t, f.Validate(), ErrInvalidAgentFrame, "%+v", f)
	}
}

func TestAgentConnRefusesToSendInvalidFrames(t *testing.T) {
	helper, _ := agentPair(t)
	assert.ErrorIs(t, helper.WriteFrame(AgentFrame{Kind: AgentKindRequest, Method: "ping"}), ErrInvalidAgentFrame)
	big := append(append([]byte(`"`), bytes.Repeat([]byte("a"), MaxFrameSize)...), '"')
	err := helper.WriteFrame(AgentFrame{Kind: AgentKindReply, ID: 1, Result: big})
	assert.ErrorIs(t, err, ErrFrameTooLarge)
}

func TestAgentConnReadsInvalidFrameAndStaysInSync(t *testing.T) {
	a, b := net.Pipe()
	helper := NewAgentConn(a)
	defer helper.Close()
	defer b.Close()
	go func() {
		_ = WriteFrame(b, []byte(`{"kind":"reply"}`))              // no id
		_ = WriteFrame(b, []byte(`not json`))                      // undecodable
		_ = WriteFrame(b, []byte(`{"kind":"reply","id":9,"x":1}`)) // fine, unknown field ignored
		_ = b.Close()
	}()
	_, err := helper.ReadFrame()
	assert.ErrorIs(t, err, ErrInvalidAgentFrame)
	_, err = helper.ReadFrame()
	assert.ErrorIs(t, err, ErrInvalidAgentFrame)
	f, err := helper.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, uint64(9), f.ID)
	_, err = helper.ReadFrame()
	assert.ErrorIs(t, err, io.EOF)
}
