package protocol

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxFrameSize is the largest frame body either side may send: 10 MiB.
const MaxFrameSize = 10 * 1024 * 1024

// ErrFrameTooLarge is returned when a frame's declared or actual length
// exceeds MaxFrameSize (or ReadFrameMax's bound). The connection it came
// from cannot be resynchronised and must be closed.
var ErrFrameTooLarge = errors.New("protocol: frame exceeds its size limit")

// ReadFrame reads one length-prefixed frame body from r. It never allocates
// more than MaxFrameSize bytes, whatever the peer declares. A clean EOF before
// the first header byte is returned as io.EOF; a truncated frame as
// io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader) ([]byte, error) { return ReadFrameMax(r, MaxFrameSize) }

// ReadFrameMax is ReadFrame for a channel whose frames are at most max
// bytes (max ≤ MaxFrameSize); a larger one is ErrFrameTooLarge.
func ReadFrameMax(r io.Reader, max uint32) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > max || n > MaxFrameSize {
		return nil, fmt.Errorf("%w: peer declared %d bytes; at most %s are taken", ErrFrameTooLarge, n, sizeText(min(max, MaxFrameSize)))
	}
	body, err := readBody(r, int(n))
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return body, nil
}

// sizeText is n bytes as people read it: whole MiB as MiB.
func sizeText(n uint32) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// frameChunk is the most ReadFrame allocates ahead of the bytes actually
// received: a peer that declares 10 MiB and then stalls costs 64 KiB, not
// 10 MiB.
const frameChunk = 64 * 1024

// readBody reads exactly n bytes, growing the buffer as data arrives (by
// doubling, never beyond n).
func readBody(r io.Reader, n int) ([]byte, error) {
	body := make([]byte, min(n, frameChunk))
	got := 0
	for {
		m, err := io.ReadFull(r, body[got:])
		got += m
		if err != nil {
			return nil, err
		}
		if got == n {
			return body, nil
		}
		grown := make([]byte, min(2*len(body), n))
		copy(grown, body)
		body = grown
	}
}

// WriteFrame writes body as one frame. Header and body go out in a single
// Write so that concurrent writers serialised by a mutex never interleave.
func WriteFrame(w io.Writer, body []byte) error {
	if len(body) > MaxFrameSize {
		return fmt.Errorf("%w: refusing to send %d bytes", ErrFrameTooLarge, len(body))
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	_, err := w.Write(buf)
	return err
}

// WriteJSON marshals v and writes it as one frame.
func WriteJSON(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("protocol: marshal frame: %w", err)
	}
	return WriteFrame(w, body)
}
