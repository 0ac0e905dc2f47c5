package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"
)

// FuzzReadFrame feeds arbitrary bytes to the frame reader. Invariants: a
// frame is returned only if the header's length fits the cap and that many
// bytes followed; an over-cap declaration is always ErrFrameTooLarge; a
// short input is EOF/ErrUnexpectedEOF; no more than the bytes present (plus
// one chunk) is ever allocated.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0})
	f.Add(frameBytes([]byte(`{"method":"isRunning"}`)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3})
	f.Add([]byte{0, 0xa0, 0, 1})
	f.Add([]byte{0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		body, err := ReadFrame(bytes.NewReader(data))
		if len(data) < 4 {
			if len(data) == 0 && !errors.Is(err, io.EOF) {
				t.Fatalf("empty input: want io.EOF, got %v", err)
			}
			if len(data) > 0 && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("short header: want io.ErrUnexpectedEOF, got %v", err)
			}
			return
		}
		declared := binary.BigEndian.Uint32(data)
		switch {
		case declared > MaxFrameSize:
			if !errors.Is(err, ErrFrameTooLarge) {
				t.Fatalf("declared %d: want ErrFrameTooLarge, got %v", declared, err)
			}
		case int(declared) > len(data)-4:
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("declared %d with %d present: want ErrUnexpectedEOF, got %v", declared, len(data)-4, err)
			}
		default:
			if err != nil {
				t.Fatalf("valid frame: %v", err)
			}
			if !bytes.Equal(body, data[4:4+declared]) {
				t.Fatal("body differs from input")
			}
			if cap(body) > int(declared) && cap(body) > frameChunk {
				t.Fatalf("cap %d exceeds declared %d", cap(body), declared)
			}
		}
	})
}

// FuzzDecodeRequest feeds arbitrary frame bodies to the request decoder.
// Invariants: failures are *DecodeError whose RawID, when present, is valid
// JSON; a decoded request has a method, and re-encodes to a frame that
// decodes to the same request.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"method":"isRunning"}`))
	f.Add([]byte(`{"method":"configure","id":1,"params":{"userDataName":"n","userDataRoot":"/r","sessionOnly":true}}`))
	f.Add([]byte(`{"method":"spawn","id":4.0,"params":{"id":"p","name":"s","command":"c","args":[],"additionalMounts":{"a/b":{"path":"x","mode":"ro"}}}}`))
	f.Add([]byte(`{"id":7,"method":5}`))
	f.Add([]byte(`{"id":"x","method":"isRunning"}`))
	f.Add([]byte(`{"id":1e30,"method":"a"}`))
	f.Add([]byte(`{bad`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeRequest(body)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("want *DecodeError, got %T %v", err, err)
			}
			if de.RawID != nil && !json.Valid(de.RawID) {
				t.Fatalf("RawID is not JSON: %q", de.RawID)
			}
			return
		}
		if req.Method == "" {
			t.Fatal("decoded request without method")
		}
		if req.Params != nil && !json.Valid(req.Params) {
			t.Fatalf("params not JSON: %q", req.Params)
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		req2, err := DecodeRequest(again)
		if err != nil {
			t.Fatalf("re-decode of %s: %v", again, err)
		}
		if req2.Method != req.Method || (req.ID == nil) != (req2.ID == nil) || (req.ID != nil && *req.ID != *req2.ID) {
			t.Fatalf("round trip changed the request: %+v vs %+v", req, req2)
		}
		if !jsonEqual(req.Params, req2.Params) {
			t.Fatalf("round trip changed params: %s vs %s", req.Params, req2.Params)
		}
	})
}

// jsonEqual compares two JSON values by meaning (re-encoding may escape
// characters differently).
func jsonEqual(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	va, erra := decodeNumbersAsText(a)
	vb, errb := decodeNumbersAsText(b)
	if erra != nil || errb != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// decodeNumbersAsText decodes raw keeping each number as its literal
// (json.Number): valid JSON may hold a number beyond float64 (1e911),
// which the client's params may carry and a float64 cannot.
func decodeNumbersAsText(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON value")
	}
	return v, nil
}
