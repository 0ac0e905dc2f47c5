package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func frameBytes(body []byte) []byte {
	var buf bytes.Buffer
	if err := WriteFrame(&buf, body); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

func TestFrameRoundTrip(t *testing.T) {
	bodies := [][]byte{
		{},
		[]byte(`{"method":"isRunning"}`),
		bytes.Repeat([]byte("x"), frameChunk-1),
		bytes.Repeat([]byte("y"), frameChunk),
		bytes.Repeat([]byte("z"), 3*frameChunk+17), // exercises buffer growth
		bytes.Repeat([]byte("m"), MaxFrameSize),    // exactly the limit is allowed
	}
	var stream bytes.Buffer
	for _, b := range bodies {
		require.NoError(t, WriteFrame(&stream, b))
	}
	for i, want := range bodies {
		got, err := ReadFrame(&stream)
		require.NoError(t, err, "frame %d", i)
		assert.Equal(t, len(want), len(got), "frame %d", i)
		assert.True(t, bytes.Equal(want, got), "frame %d content", i)
	}
	_, err := ReadFrame(&stream)
	assert.ErrorIs(t, err, io.EOF, "clean end between frames is io.EOF")
}

func TestFrameHeaderIsBigEndianLength(t *testing.T) {
	b := frameBytes([]byte("hello"))
	assert.Equal(t, []byte{0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o'}, b)
}

func TestWriteJSON(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteJSON(&buf, map[string]bool{"success": true}))
	body, err := ReadFrame(&buf)
	require.NoError(t, err)
	assert.JSONEq(t, `{"success":true}`, string(body))

	err = WriteJSON(&buf, func() {})
	assert.Error(t, err, "unmarshalable value is refused")
}

func TestReadFrameTruncated(t *testing.T) {
	full := frameBytes([]byte(`{"method":"isRunning"}`))
	for cut := 1; cut < len(full); cut++ {
		_, err := ReadFrame(bytes.NewReader(full[:cut]))
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "cut at %d", cut)
	}
	// A large declared body cut short: also unexpected EOF, after growth.
	big := frameBytes(bytes.Repeat([]byte("a"), 5*frameChunk))
	_, err := ReadFrame(bytes.NewReader(big[:len(big)-1]))
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

func TestReadFrameOversizedDeclaredLength(t *testing.T) {
	for _, n := range []uint32{MaxFrameSize + 1, 0xFFFFFFFF} {
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], n)
		_, err := ReadFrame(bytes.NewReader(hdr[:]))
		assert.ErrorIs(t, err, ErrFrameTooLarge, "declared %d", n)
	}
}

func TestWriteFrameRefusesOversizedBody(t *testing.T) {
	var buf bytes.Buffer
	err := WriteFrame(&buf, make([]byte, MaxFrameSize+1))
	assert.ErrorIs(t, err, ErrFrameTooLarge)
	assert.Zero(t, buf.Len(), "nothing is written for a refused frame")
}

// stallingReader yields its data, then fails: a peer that declares a
// large frame and sends nothing more.
type stallingReader struct{ data []byte }

func (s *stallingReader) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, errors.New("stalled")
	}
	n := copy(p, s.data)
	s.data = s.data[n:]
	return n, nil
}

func TestReadFrameDoesNotPreallocateDeclaredLength(t *testing.T) {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxFrameSize)
	r := &stallingReader{data: hdr[:]}
	before := memAllocated()
	_, err := ReadFrame(r)
	after := memAllocated()
	require.Error(t, err)
	assert.Less(t, after-before, uint64(MaxFrameSize/4), "a stalled 10 MiB frame must not allocate 10 MiB")
}
