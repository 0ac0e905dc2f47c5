package agentrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// DefaultMaxInFlight bounds concurrently handled requests when
// ServerOptions.MaxInFlight is zero; the read loop waits when it is reached
// (back-pressure on the helper).
const DefaultMaxInFlight = 256

// Handler serves one request: the result it returns is the reply's (nil
// for a reply without one), its error the reply's error. ctx ends when
// Serve does.
type Handler func(ctx context.Context, params json.RawMessage) (any, error)

// Handle adapts a typed method: the request must carry params, which must
// decode into P.
func Handle[P, R any](f func(context.Context, P) (R, error)) Handler {
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		var p P
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return f(ctx, p)
	}
}

// HandleNoResult adapts a typed method whose reply carries no result.
func HandleNoResult[P any](f func(context.Context, P) error) Handler {
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		var p P
		if err := decodeParams(raw, &p); err != nil {
			return nil, err
		}
		return nil, f(ctx, p)
	}
}

func decodeParams(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return errors.New("missing params")
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("invalid params: %w", err)
	}
	return nil
}

// ServerOptions tunes a Server. The zero value is ready to use.
type ServerOptions struct {
	Logger *slog.Logger
	// MaxInFlight: see DefaultMaxInFlight.
	MaxInFlight int
	// Final names the methods served inline, nothing else being read
	// while one runs; once one has succeeded and its reply is written,
	// Serve closes the connection and returns nil (the agent's shutdown
	// and suspend).
	Final []string
}

// Server speaks the agent side of the agent channel (protocol/agent.go):
// it says hello, serves the helper's requests with the Handler registered
// for each method, concurrently, and sends events. Replies and events go
// through one serialized writer: frames never interleave. The agent and
// every test that plays the agent use it.
type Server struct {
	conn    io.ReadWriteCloser
	methods map[string]Handler
	opts    ServerOptions
	log     *slog.Logger
	writeMu sync.Mutex
}

// NewServer serves methods on conn.
func NewServer(conn io.ReadWriteCloser, methods map[string]Handler, opts ServerOptions) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	return &Server{conn: conn, methods: methods, opts: opts, log: opts.Logger}
}

// SendHello sends the agent's hello, the channel's first frame.
func (s *Server) SendHello(h protocol.AgentHello) error {
	return s.send(protocol.AgentFrame{Kind: protocol.AgentKindHello, Hello: &h})
}

// Emit sends one event. An error means the helper is gone.
func (s *Server) Emit(ev protocol.Event) error {
	return s.send(protocol.AgentFrame{Kind: protocol.AgentKindEvent, Event: &ev})
}

// Serve reads requests until the connection fails (it returns the read
// error: io.EOF when the helper closed it), ctx ends (ctx.Err()), or the
// Final method has been served (nil). It returns once every handler it
// started has returned. Frames that are not requests are logged and
// skipped; one that names an id gets an error reply.
func (s *Server) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	sem := make(chan struct{}, s.opts.MaxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the wait: handlers see the end
	frames, readErr := s.readFrames(ctx)
	for {
		body, ok := <-frames
		if !ok {
			return <-readErr
		}
		f, ok := s.request(body)
		if !ok {
			continue
		}
		if slices.Contains(s.opts.Final, f.Method) {
			// Served inline: nothing else is read once it starts.
			result, err := s.dispatch(ctx, f)
			s.reply(f.ID, result, err)
			if err == nil {
				s.conn.Close()
				return nil
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			result, err := s.dispatch(ctx, f)
			s.reply(f.ID, result, err)
		}()
	}
}

// readFrames reads frames into the channel it returns until reading fails
// (the error goes to the second channel, then the first is closed) or ctx
// ends.
func (s *Server) readFrames(ctx context.Context) (<-chan []byte, <-chan error) {
	frames := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		for {
			body, err := protocol.ReadFrame(s.conn)
			if err != nil {
				readErr <- err
				close(frames)
				return
			}
			select {
			case frames <- body:
			case <-ctx.Done():
				return // Serve has returned; nobody reads frames any more.
			}
		}
	}()
	return frames, readErr
}

// request decodes a request frame; anything else is logged (and answered
// with an error when it names an id) and reported not ok.
func (s *Server) request(body []byte) (protocol.AgentFrame, bool) {
	var f protocol.AgentFrame
	if err := json.Unmarshal(body, &f); err != nil {
		s.log.Warn("ignoring an undecodable frame from the helper", "err", err, "bytes", len(body))
		return f, false
	}
	if f.Kind != protocol.AgentKindRequest || f.ID == 0 {
		s.log.Warn("ignoring a frame that is not a request", "kind", f.Kind, "id", f.ID)
		if f.ID != 0 {
			s.reply(f.ID, nil, fmt.Errorf("agent expects request frames, got kind %q", f.Kind))
		}
		return f, false
	}
	return f, true
}

func (s *Server) dispatch(ctx context.Context, f protocol.AgentFrame) (any, error) {
	h := s.methods[f.Method]
	if h == nil {
		return nil, fmt.Errorf("unknown agent method %q", f.Method)
	}
	return h(ctx, f.Params)
}

// reply sends the reply to request id; a failure means the helper is gone
// and is only logged (the read loop notices).
func (s *Server) reply(id uint64, result any, err error) {
	f := protocol.AgentFrame{Kind: protocol.AgentKindReply, ID: id}
	if err != nil {
		f.Error = err.Error()
	} else if result != nil {
		raw, merr := json.Marshal(result)
		if merr != nil {
			f.Error = fmt.Sprintf("agent: encoding the result: %v", merr)
		} else {
			f.Result = raw
		}
	}
	if serr := s.send(f); serr != nil {
		s.log.Debug("could not send a reply", "id", id, "err", serr)
	}
}

// send writes one frame; frames from concurrent goroutines never interleave.
func (s *Server) send(f protocol.AgentFrame) error {
	body, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("agent: encoding a frame: %w", err)
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return protocol.WriteFrame(s.conn, body)
}
