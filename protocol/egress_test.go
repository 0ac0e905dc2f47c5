package protocol

import (
	"bytes"
	"encoding/binary"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEgressRequestRoundTripLeavesTrailingBytes(t *testing.T) {
	var buf bytes.Buffer
	req := EgressRequest{SpawnID: "s1", Token: "tok", Host: "api.example.com", Port: 443}
	require.NoError(t, WriteEgressRequest(&buf, req))
	buf.WriteString("TLS bytes")
	got, err := ReadEgressRequest(&buf)
	require.NoError(t, err)
	require.Equal(t, req, got)
	require.Equal(t, "TLS bytes", buf.String(), "the reader must not consume spliced bytes")
}

func TestEgressReplyRoundTrip(t *testing.T) {
	for _, rep := range []EgressReply{{OK: true}, {Blocked: true, Error: "blocked-by-allowlist: x"}, {Error: "dial failed"}} {
		var buf bytes.Buffer
		require.NoError(t, WriteEgressReply(&buf, rep))
		got, err := ReadEgressReply(&buf)
		require.NoError(t, err)
		require.Equal(t, rep, got)
	}
	var buf bytes.Buffer
	require.NoError(t, WriteEgressReply(&buf, EgressReply{Error: strings.Repeat("é", MaxEgressFrameSize)}))
	got, err := ReadEgressReply(&buf)
	require.NoError(t, err, "a long error is cut to fit")
	require.Less(t, len(got.Error), MaxEgressFrameSize)
}

func TestEgressRequestValidation(t *testing.T) {
	bad := []EgressRequest{
		{Host: "a.com", Port: 443},
		{SpawnID: "s", Host: "", Port: 443},
		{SpawnID: "s", Host: "a.com", Port: 0},
		{SpawnID: "s", Host: "a.com", Port: 65536},
		{SpawnID: "s", Host: "a b.com", Port: 80},
		{SpawnID: "s", Host: "user@a.com", Port: 80},
		{SpawnID: "s", Host: "a.com/x", Port: 80},
		{SpawnID: "s", Host: strings.Repeat("a", MaxEgressHostLen+1), Port: 80},
		{SpawnID: "s", Token: strings.Repeat("t", MaxEgressTokenLen+1), Host: "a.com", Port: 80},
	}
	for _, req := range bad {
		require.ErrorIs(t, req.Validate(), ErrEgressFrame, "%+v", req)
		require.ErrorIs(t, WriteEgressRequest(io.Discard, req), ErrEgressFrame)
	}
}

func TestEgressFrameRejectsHostileInput(t *testing.T) {
	cases := map[string][]byte{
		"oversized":     {0, 0, 0x10, 1},
		"unknown field": frameBytes([]byte(`{"spawnId":"s","host":"a.com","port":1,"x":1}`)),
		"trailing data": frameBytes([]byte(`{"spawnId":"s","host":"a.com","port":1} {}`)),
		"not json":      frameBytes([]byte(`nope`)),
		"bad port":      frameBytes([]byte(`{"spawnId":"s","host":"a.com","port":0}`)),
	}
	for name, data := range cases {
		_, err := ReadEgressRequest(bytes.NewReader(data))
		require.ErrorIs(t, err, ErrEgressFrame, name)
	}
	_, err := ReadEgressRequest(bytes.NewReader([]byte{0, 0, 0, 9, '{'}))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, err = ReadEgressReply(bytes.NewReader(frameBytes([]byte(`{"ok":true,"blocked":true}`))))
	require.ErrorIs(t, err, ErrEgressFrame)
}

// FuzzEgressRequest: the decoder never reads past the declared frame, never
// accepts a frame over the cap, and whatever it accepts is valid and
// survives a round trip.
func FuzzEgressRequest(f *testing.F) {
	f.Add(frameBytes([]byte(`{"spawnId":"s1","token":"t","host":"api.example.com","port":443}`)))
	f.Add(frameBytes([]byte(`{"spawnId":"s1","host":"::1","port":80}`)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(frameBytes([]byte(`null`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		req, err := ReadEgressRequest(r)
		if err != nil {
			return
		}
		declared := binary.BigEndian.Uint32(data)
		if declared > MaxEgressFrameSize {
			t.Fatalf("accepted a frame declaring %d bytes", declared)
		}
		if consumed := len(data) - r.Len(); consumed != 4+int(declared) {
			t.Fatalf("consumed %d bytes of a %d-byte frame", consumed, 4+declared)
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("accepted an invalid request: %v", err)
		}
		var buf bytes.Buffer
		if err := WriteEgressRequest(&buf, req); err != nil {
			t.Fatalf("re-encoding an accepted request: %v", err)
		}
		again, err := ReadEgressRequest(&buf)
		if err != nil || again != req {
			t.Fatalf("round trip: %+v, %v (was %+v)", again, err, req)
		}
	})
}
