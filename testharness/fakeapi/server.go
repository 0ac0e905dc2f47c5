package fakeapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// AnswerPrefix starts every answer: the answer to a user message m is
// AnswerPrefix + m's last line, so a test can tell which turn an answer
// came from.
const AnswerPrefix = "fake-api answer to: "

// maxRequestBytes bounds one request body; the CLI's requests (system
// prompt, tool definitions, history) stay well below it.
const maxRequestBytes = 16 << 20

// Request is what the server saw of one request.
type Request struct {
	Method, Path string
	Stream       bool
	LastUserText string
}

// Handler is the fake API; its zero value is ready to serve.
type Handler struct {
	mu       sync.Mutex
	requests []Request
}

// Requests returns every request served so far, in order.
func (h *Handler) Requests() []Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Request(nil), h.requests...)
}

// Answered returns the user texts the server answered through
// /v1/messages, in order.
func (h *Handler) Answered() []string {
	var texts []string
	for _, r := range h.Requests() {
		if r.Path == "/v1/messages" && r.LastUserText != "" {
			texts = append(texts, r.LastUserText)
		}
	}
	return texts
}

// messagesRequest is the part of a Messages API request the server reads.
type messagesRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := Request{Method: r.Method, Path: r.URL.Path}
	defer func() {
		h.mu.Lock()
		h.requests = append(h.requests, rec)
		h.mu.Unlock()
	}()
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		http.Error(w, `{"type":"error","error":{"type":"not_found_error","message":"not served by the fake API"}}`, http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes))
	var req messagesRequest
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"unreadable request"}}`, http.StatusBadRequest)
		return
	}
	rec.Stream = req.Stream
	rec.LastUserText = lastUserText(req)
	answer := AnswerPrefix + lastLine(rec.LastUserText)
	if req.Stream {
		writeStream(w, req.Model, answer)
		return
	}
	writeMessage(w, req.Model, answer)
}

// lastUserText is the text of req's last user message: a string content,
// or its last text block.
func lastUserText(req messagesRequest) string {
	for i := len(req.Messages) - 1; i >= 0; i-- {
		m := req.Messages[i]
		if m.Role != "user" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			return s
		}
		var blocks []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(m.Content, &blocks) != nil {
			return ""
		}
		for j := len(blocks) - 1; j >= 0; j-- {
			// The CLI adds its own reminders as text blocks that start
			// with a tag; the user's words are the last other one.
			if blocks[j].Type == "text" && !strings.HasPrefix(strings.TrimSpace(blocks[j].Text), "<") {
				return blocks[j].Text
			}
		}
		return ""
	}
	return ""
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[i+1:])
	}
	return s
}

func usage(out int) map[string]int {
	return map[string]int{"input_tokens": 12, "output_tokens": out}
}

// writeMessage answers a non-streamed request.
func writeMessage(w http.ResponseWriter, model, text string) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
		"content":     []any{map[string]string{"type": "text", "text": text}},
		"stop_reason": "end_turn", "stop_sequence": nil, "usage": usage(len(text)),
	})
}

// writeStream answers a streamed request as the Messages API does: a
// message_start, one text block sent in a few deltas, a message_delta with
// the stop reason, a message_stop.
func writeStream(w http.ResponseWriter, model, text string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	flusher, _ := w.(http.Flusher)
	send := func(event string, data any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": usage(1)}})
	send("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
		"content_block": map[string]string{"type": "text", "text": ""}})
	send("ping", map[string]string{"type": "ping"})
	for _, part := range chunks(text, 8) {
		send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]string{"type": "text_delta", "text": part}})
	}
	send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}, "usage": map[string]int{"output_tokens": len(text)}})
	send("message_stop", map[string]string{"type": "message_stop"})
}

// chunks splits s into pieces of at most n bytes, on rune boundaries.
func chunks(s string, n int) []string {
	var out []string
	for len(s) > n {
		i := n
		for i > 0 && !utf8RuneStart(s[i]) {
			i--
		}
		if i == 0 {
			i = n
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return append(out, s)
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
