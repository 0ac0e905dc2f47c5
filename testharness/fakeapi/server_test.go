package fakeapi

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url+"/v1/messages?beta=true", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestStreamedAnswerNamesTheLastUserText reads a streamed answer as the
// CLI does: the text deltas joined are the answer to the last user text
// (its last line), and the events come in the Messages API's order.
func TestStreamedAnswerNamesTheLastUserText(t *testing.T) {
	h := &Handler{}
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp := post(t, srv.URL, `{"model":"m","stream":true,"messages":[
		{"role":"user","content":"an older turn"},
		{"role":"assistant","content":"ok"},
		{"role":"user","content":[{"type":"text","text":"<system-reminder>x</system-reminder>"},{"type":"text","text":"context\nsecond tüŕn"}]}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var events []string
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if ev, ok := strings.CutPrefix(line, "event: "); ok {
			events = append(events, ev)
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var d struct {
				Delta struct{ Text string } `json:"delta"`
			}
			require.NoError(t, json.Unmarshal([]byte(data), &d), data)
			text.WriteString(d.Delta.Text)
		}
	}
	assert.Equal(t, AnswerPrefix+"second tüŕn", text.String())
	assert.Equal(t, "message_start", events[0])
	assert.Equal(t, "message_stop", events[len(events)-1])
	assert.Contains(t, events, "message_delta")
	assert.Equal(t, []string{"context\nsecond tüŕn"}, h.Answered())
}

func TestUnstreamedAnswerAndUnknownPaths(t *testing.T) {
	h := &Handler{}
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp := post(t, srv.URL, `{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	var msg struct {
		Content []struct{ Text string } `json:"content"`
		Stop    string                  `json:"stop_reason"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&msg))
	assert.Equal(t, AnswerPrefix+"hello", msg.Content[0].Text)
	assert.Equal(t, "end_turn", msg.Stop)

	assert.Equal(t, http.StatusBadRequest, post(t, srv.URL, `{not json`).StatusCode)
	get, err := http.Get(srv.URL + "/api/other")
	require.NoError(t, err)
	get.Body.Close()
	assert.Equal(t, http.StatusNotFound, get.StatusCode)
	reqs := h.Requests()
	require.Len(t, reqs, 3)
	assert.Equal(t, "/api/other", reqs[2].Path)
	assert.Equal(t, []string{"hello"}, h.Answered())
}
