package protocol

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSendGuestResponseID: the id comes back as the client has it, a
// string or a number; an integer number is its decimal text either way.
func TestSendGuestResponseID(t *testing.T) {
	for raw, want := range map[string]string{
		`{"id":7}`:                      "7",
		`{"id":"7"}`:                    "7",
		`{"id":7.0}`:                    "7",
		`{"id":7e3}`:                    "7000",
		`{"id":1745000000000000}`:       "1745000000000000",
		`{"id":"req-1"}`:                "req-1",
		`{"id":null}`:                   "",
		`{"resultJson":"{}"}`:           "",
		`{"id":18446744073709551615}`:   "18446744073709551615",
		`{"id":"7","resultJson":"[1]"}`: "7",
	} {
		var p SendGuestResponseParams
		require.NoError(t, json.Unmarshal([]byte(raw), &p), raw)
		assert.Equal(t, GuestRequestID(want), p.ID, raw)
	}
	for _, raw := range []string{`{"id":-1}`, `{"id":7.5}`, `{"id":true}`, `{"id":{}}`, `{"id":1e300}`} {
		var p SendGuestResponseParams
		assert.Error(t, json.Unmarshal([]byte(raw), &p), raw)
	}
	var p SendGuestResponseParams
	require.NoError(t, json.Unmarshal([]byte(`{"id":1,"resultJson":"{\"a\":1}","error":"e"}`), &p))
	assert.Equal(t, `"{\"a\":1}"`, string(p.ResultJSON))
	assert.Equal(t, "e", p.Error)
}

func TestGuestRequestTimeout(t *testing.T) {
	assert.Equal(t, DefaultGuestRequestTimeout, GuestRequestTimeout(0))
	assert.Equal(t, DefaultGuestRequestTimeout, GuestRequestTimeout(-5))
	assert.Equal(t, 1500*time.Millisecond, GuestRequestTimeout(1500))
	assert.Equal(t, MinGuestRequestTimeout, GuestRequestTimeout(1), "a shorter timeout is raised to the floor")
	assert.Equal(t, MaxGuestRequestTimeout, GuestRequestTimeout(MaxGuestRequestTimeout.Milliseconds()+1))
	assert.Equal(t, 2*time.Second, GuestCall{TimeoutMillis: 2000}.Timeout())
	assert.Equal(t, 5*time.Minute, DefaultGuestRequestTimeout, "the documented default")
}

// TestGuestRequestOnTheAgentChannel: a request event's body travels on the
// agent channel, params as the guest's JSON text, and never in a client
// event's shape unless set.
func TestGuestRequestOnTheAgentChannel(t *testing.T) {
	ev := Event{Type: EventRequest, ID: "spawn-1", GuestRequest: &GuestRequest{ID: 3, Method: "m", Params: json.RawMessage(`{"n":12345678901234567890}`), TimeoutMillis: 10}}
	f := AgentFrame{Kind: AgentKindEvent, Event: &ev}
	b, err := json.Marshal(f)
	require.NoError(t, err)
	var back AgentFrame
	require.NoError(t, json.Unmarshal(b, &back))
	require.NotNil(t, back.Event.GuestRequest)
	assert.Equal(t, *ev.GuestRequest, *back.Event.GuestRequest)
	client, err := json.Marshal(Event{Type: EventRequest, ID: "9", Method: "m", Params: json.RawMessage(`{"a":1}`)})
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"request","id":"9","method":"m","params":{"a":1}}`, string(client))
	exit, err := json.Marshal(Event{Type: EventExit, ID: "p", Signal: "SIGKILL", OOMKillCount: new(int)})
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"exit","id":"p","signal":"SIGKILL","oomKillCount":0}`, string(exit))
}
