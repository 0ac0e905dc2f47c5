package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// ErrInvalidAgentFrame is wrapped by AgentFrame.Validate's errors. A frame
// that fails validation was still a complete frame: the stream stays in sync
// and the reader may carry on (or drop the peer, its choice).
var ErrInvalidAgentFrame = errors.New("invalid agent frame")

// Validate checks the envelope: Kind is known and carries what it needs —
// hello: Hello set; request: ID > 0 and Method; reply: ID > 0; event: Event
// with a Type.
func (f *AgentFrame) Validate() error {
	switch f.Kind {
	case AgentKindHello:
		if f.Hello == nil {
			return fmt.Errorf("%w: hello without hello body", ErrInvalidAgentFrame)
		}
	case AgentKindRequest:
		if f.ID == 0 {
			return fmt.Errorf("%w: request without id", ErrInvalidAgentFrame)
		}
		if f.Method == "" {
			return fmt.Errorf("%w: request %d without method", ErrInvalidAgentFrame, f.ID)
		}
	case AgentKindReply:
		if f.ID == 0 {
			return fmt.Errorf("%w: reply without id", ErrInvalidAgentFrame)
		}
	case AgentKindEvent:
		if f.Event == nil || f.Event.Type == "" {
			return fmt.Errorf("%w: event without type", ErrInvalidAgentFrame)
		}
	case "":
		return fmt.Errorf("%w: missing kind", ErrInvalidAgentFrame)
	default:
		return fmt.Errorf("%w: unknown kind %.40q", ErrInvalidAgentFrame, f.Kind)
	}
	return nil
}

// AgentConn carries AgentFrames over one byte stream (a vsock connection, a
// socketpair). WriteFrame may be called from many goroutines at once; each
// frame goes out whole. ReadFrame must be called from one goroutine at a
// time (a single reader loop).
type AgentConn struct {
	rwc io.ReadWriteCloser
	wmu sync.Mutex
}

// NewAgentConn wraps rwc. Closing the AgentConn closes rwc.
func NewAgentConn(rwc io.ReadWriteCloser) *AgentConn {
	return &AgentConn{rwc: rwc}
}

// WriteFrame validates f and writes it as one frame. It refuses an invalid
// frame or one larger than MaxFrameSize (the stream is untouched then).
func (c *AgentConn) WriteFrame(f AgentFrame) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("protocol: refusing to send: %w", err)
	}
	body, err := json.Marshal(&f)
	if err != nil {
		return fmt.Errorf("protocol: marshal agent frame: %w", err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return WriteFrame(c.rwc, body)
}

// ReadFrame reads and validates the next frame. Errors:
//   - io.EOF: the peer closed cleanly between frames;
//   - io.ErrUnexpectedEOF, ErrFrameTooLarge, other I/O errors: the stream
//     is unusable, close it;
//   - ErrInvalidAgentFrame (undecodable JSON or a bad envelope): the frame
//     was consumed whole, the stream is still in sync. The returned frame
//     holds whatever decoded (e.g. the ID, so a reply can name it).
func (c *AgentConn) ReadFrame() (AgentFrame, error) {
	body, err := ReadFrame(c.rwc)
	if err != nil {
		return AgentFrame{}, err
	}
	return DecodeAgentFrame(body)
}

// DecodeAgentFrame decodes and validates one agent frame body; see
// AgentConn.ReadFrame for the errors.
func DecodeAgentFrame(body []byte) (AgentFrame, error) {
	var f AgentFrame
	if err := json.Unmarshal(body, &f); err != nil {
		return f, fmt.Errorf("%w: %v", ErrInvalidAgentFrame, err)
	}
	if err := f.Validate(); err != nil {
		return f, err
	}
	return f, nil
}

// Close closes the underlying stream; a blocked ReadFrame returns.
func (c *AgentConn) Close() error { return c.rwc.Close() }
