package virtio

import (
	"errors"
	"fmt"
	"io"
)

// ErrChainFull is returned (wrapping io.ErrShortWrite) by ChainWriter.Write
// when the chain's writable buffers cannot take all of p.
var ErrChainFull = fmt.Errorf("virtio: writable buffers of the chain are full: %w", io.ErrShortWrite)

// Buffer is one validated guest buffer of a chain: Len bytes at guest
// physical address Addr, lying in guest memory, Len > 0.
type Buffer struct {
	Addr uint64
	Len  uint32
}

// Chain is a validated descriptor chain popped from a Queue. Device code
// reads the driver's request through Reader and writes its reply through
// Writer, then hands the chain back with Queue.Push. Its buffers are already
// checked (see package doc); the guest can still change their contents at
// any time, so parse what Reader returns as untrusted bytes, once.
//
// A Chain is not safe for concurrent use; it may move between goroutines.
type Chain struct {
	head     uint16
	queue    *Queue
	inline   [4]Buffer // backing store for short chains
	bufs     []Buffer  // readable buffers, then writable ones
	readable []Buffer
	writable []Buffer
	readLen  uint32
	writeLen uint32
	reader   ChainReader
	writer   ChainWriter
	pushed   bool
}

// Head is the index of the chain's first descriptor, the id the used ring
// reports to the driver.
func (c *Chain) Head() uint16 { return c.head }

// ReadableLen is the total length of the device-readable buffers.
func (c *Chain) ReadableLen() uint32 { return c.readLen }

// WritableLen is the total length of the device-writable buffers.
func (c *Chain) WritableLen() uint32 { return c.writeLen }

// Readable returns the device-readable buffers in chain order. The slice
// belongs to the chain; do not modify it.
func (c *Chain) Readable() []Buffer { return c.readable }

// Writable returns the device-writable buffers in chain order. The slice
// belongs to the chain; do not modify it.
func (c *Chain) Writable() []Buffer { return c.writable }

// Reader returns the chain's reader: its readable buffers as one byte
// stream. Every call returns the same reader, so its position persists.
func (c *Chain) Reader() *ChainReader { return &c.reader }

// Writer returns the chain's writer: its writable buffers as one byte
// stream. Every call returns the same writer; Written is what to Push.
func (c *Chain) Writer() *ChainWriter { return &c.writer }

// ChainReader reads a chain's readable buffers as one stream, whatever the
// buffers' boundaries. It returns io.EOF after the last byte.
type ChainReader struct {
	mem      GuestMemory
	bufs     []Buffer
	index    int    // current buffer
	offset   uint32 // offset in the current buffer
	consumed uint32
	total    uint32
}

// Read implements io.Reader. A guest-memory error (a buffer that stopped
// being RAM) is returned wrapped; the bytes before it are counted in n.
func (r *ChainReader) Read(p []byte) (int, error) {
	n := 0
	for len(p) > 0 && r.index < len(r.bufs) {
		b := r.bufs[r.index]
		chunk := b.Len - r.offset
		if uint64(chunk) > uint64(len(p)) {
			chunk = uint32(len(p))
		}
		if err := r.mem.ReadAt(p[:chunk], b.Addr+uint64(r.offset)); err != nil {
			return n, fmt.Errorf("virtio: reading chain buffer at %#x: %w", b.Addr+uint64(r.offset), err)
		}
		n += int(chunk)
		p = p[chunk:]
		r.advance(chunk)
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Skip advances the reader by up to n bytes without copying them and
// returns how many it skipped.
func (r *ChainReader) Skip(n uint32) uint32 {
	skipped := uint32(0)
	for n > 0 && r.index < len(r.bufs) {
		chunk := min(r.bufs[r.index].Len-r.offset, n)
		r.advance(chunk)
		n -= chunk
		skipped += chunk
	}
	return skipped
}

func (r *ChainReader) advance(chunk uint32) {
	r.offset += chunk
	r.consumed += chunk
	if r.offset == r.bufs[r.index].Len {
		r.index++
		r.offset = 0
	}
}

// Remaining is how many readable bytes are left.
func (r *ChainReader) Remaining() uint32 { return r.total - r.consumed }

// Consumed is how many bytes were read or skipped so far.
func (r *ChainReader) Consumed() uint32 { return r.consumed }

// ChainWriter writes a chain's writable buffers as one stream and counts
// the bytes written, which is the length to give Queue.Push.
type ChainWriter struct {
	mem     GuestMemory
	bufs    []Buffer
	index   int
	offset  uint32
	written uint32
	total   uint32
}

// Write implements io.Writer. When p does not fit, it writes what fits and
// returns ErrChainFull. A guest-memory error is returned wrapped.
func (w *ChainWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 && w.index < len(w.bufs) {
		b := w.bufs[w.index]
		chunk := b.Len - w.offset
		if uint64(chunk) > uint64(len(p)) {
			chunk = uint32(len(p))
		}
		if err := w.mem.WriteAt(p[:chunk], b.Addr+uint64(w.offset)); err != nil {
			return n, fmt.Errorf("virtio: writing chain buffer at %#x: %w", b.Addr+uint64(w.offset), err)
		}
		n += int(chunk)
		p = p[chunk:]
		w.offset += chunk
		w.written += chunk
		if w.offset == b.Len {
			w.index++
			w.offset = 0
		}
	}
	if len(p) > 0 {
		return n, ErrChainFull
	}
	return n, nil
}

// Written is how many bytes were written so far.
func (w *ChainWriter) Written() uint32 { return w.written }

// Available is how many more bytes fit.
func (w *ChainWriter) Available() uint32 { return w.total - w.written }

// ChainError reports a descriptor chain the queue refused. The queue has
// already returned it to the driver with used length 0, so the caller only
// logs it (rate-limited) and keeps popping.
type ChainError struct {
	Head uint16 // the head index the driver made available
	Err  error  // wraps ErrInvalidChain or a guest-memory error
}

func (e *ChainError) Error() string {
	return fmt.Sprintf("virtio: descriptor chain at head %d refused: %v", e.Head, e.Err)
}

func (e *ChainError) Unwrap() error { return e.Err }

// ErrInvalidChain is wrapped by every ChainError caused by the chain's
// shape (indices, flags, lengths, order).
var ErrInvalidChain = errors.New("invalid descriptor chain")
