package agent

// The guest-request channel, the agent's side (protocol/agent.go has the
// wire and its bounds).
//
// Each spawn gets an endpoint: a Unix socket the agent listens on for that
// spawn alone, named in its environment (protocol.GuestRequestSocketEnv).
// An isolated spawn's endpoint is bound on the thread that forks it, once
// that thread is in the spawn's mount namespace: it lies in the spawn's own
// /run (guestRequestSocket), which no other spawn and not the agent's tree
// has, so every connection it takes comes from the spawn's processes. A
// spawn that is not isolated (the process backend, unit tests) gets a socket
// of its own in the agent's tree (Options.RunDir); there every spawn can see
// every other's anyway. Each connection carries one call: the agent reads
// its GuestCall, sends the helper a request event for it and answers the
// caller with the helper's guestResponse — or with an error when the caller
// waited too long (a backstop behind the helper's own timeout), the agent
// shuts down or the call is refused (too big, too many waiting). A caller
// that hangs up gives its call up. The endpoint closes when its spawn's
// process exits; calls under way (from its background children) go on.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const (
	// guestRequestSocket is an isolated spawn's endpoint, in its own /run.
	guestRequestSocket = "/run/cowork/guest-request.sock"
	// DefaultRunDir holds the endpoints of spawns that are not isolated.
	DefaultRunDir = "/run/cowork"
	// guestCallReadTimeout bounds how long a caller may take to send its
	// call once connected.
	guestCallReadTimeout = 30 * time.Second
	// guestCallBackstop is how much longer than the call's timeout the
	// agent waits for the helper's answer before answering with an error
	// itself.
	guestCallBackstop = 30 * time.Second
	// maxEndpointConns bounds a spawn's connections served at once (the
	// waiting calls and a few being read).
	maxEndpointConns = protocol.MaxGuestRequestsPerSession + 8
)

// errGuestCallerGone answers a guestResponse whose caller hung up.
var errGuestCallerGone = errors.New("no guest request of that id is waiting (its caller hung up, or it was answered)")

// guestRequests is the agent's table of calls waiting for the helper.
type guestRequests struct {
	a *agent
	// backstop is guestCallBackstop (shorter in tests).
	backstop time.Duration

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan protocol.GuestResponseParams
	closed  bool // the agent is ending: every call is answered at once
}

func newGuestRequests(a *agent) *guestRequests {
	return &guestRequests{a: a, backstop: guestCallBackstop, waiting: make(map[uint64]chan protocol.GuestResponseParams)}
}

// endpoint is one spawn's guest-request socket.
type endpoint struct {
	r       *guestRequests
	spawnID string
	path    string // as the spawn's environment names it
	l       *net.UnixListener
	// unlink: the socket is in the agent's tree (not isolated) and is
	// removed with the endpoint.
	unlink bool
	// spawn is the isolated spawn it belongs to (nil when not isolated):
	// its session and egress, for sudo.
	spawn   *protocol.SpawnParams
	conns   atomic.Int32 // connections being served
	waiting atomic.Int32 // calls waiting for the helper
}

// listen makes the endpoint of spawn id at path (in the calling thread's
// mount namespace), reachable by any uid of that namespace.
func (r *guestRequests) listen(id, path string, unlink bool) (*endpoint, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("the guest-request socket's directory: %w", err)
	}
	_ = os.Remove(path) // a stale socket of an earlier agent
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("the guest-request socket: %w", err)
	}
	// Closed from another thread, in another mount namespace: the name
	// would be looked up there.
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("the guest-request socket: %w", err)
	}
	return &endpoint{r: r, spawnID: id, path: path, l: l, unlink: unlink}, nil
}

// serve accepts the endpoint's connections until close.
func (ep *endpoint) serve() {
	for {
		conn, err := ep.l.AcceptUnix()
		if err != nil {
			return
		}
		if ep.conns.Add(1) > maxEndpointConns {
			ep.conns.Add(-1)
			go refuseCall(conn, fmt.Sprintf("too many guest-request connections of this process (%d)", maxEndpointConns))
			continue
		}
		go func() {
			defer ep.conns.Add(-1)
			ep.serveCall(conn)
		}()
	}
}

// close stops taking connections (the spawn's process has exited).
func (ep *endpoint) close() {
	ep.l.Close()
	if ep.unlink {
		_ = os.Remove(ep.path)
	}
}

// refuseCall answers a connection with an error without reading its call.
func refuseCall(conn net.Conn, msg string) {
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(guestCallReadTimeout))
	_ = protocol.WriteJSON(conn, protocol.Response{Error: msg})
}

// serveCall reads one call, has the helper answer it and relays the answer.
func (ep *endpoint) serveCall(conn *net.UnixConn) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(guestCallReadTimeout))
	call, fds, err := readCallWithRights(conn)
	if err != nil {
		closeAll(fds...)
		ep.r.a.log.Debug("refused a guest request", "id", ep.spawnID, "err", err)
		_ = protocol.WriteJSON(conn, protocol.Response{Error: err.Error()})
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	var resp protocol.Response
	switch {
	case call.Method == protocol.GuestCallSudo:
		resp = ep.sudo(conn, call, fds)
	case strings.HasPrefix(call.Method, protocol.GuestCallAgentPrefix):
		closeAll(fds...)
		resp = protocol.Response{Error: fmt.Sprintf("%s: no such method of the guest agent", call.Method)}
	default:
		closeAll(fds...) // only sudo takes descriptors
		resp = ep.wait(conn, call)
	}
	_ = conn.SetWriteDeadline(time.Now().Add(guestCallReadTimeout))
	if err := protocol.WriteJSON(conn, resp); err != nil {
		ep.r.a.log.Debug("could not answer a guest request", "id", ep.spawnID, "err", err)
	}
}

// readGuestCall reads and checks one GuestCall frame: its length is checked
// before anything is allocated.
func readGuestCall(r io.Reader) (protocol.GuestCall, error) {
	var call protocol.GuestCall
	body, err := protocol.ReadFrameMax(r, protocol.MaxGuestCallBytes)
	if err != nil {
		return call, fmt.Errorf("reading the call: %w", err)
	}
	if err := json.Unmarshal(body, &call); err != nil {
		return call, fmt.Errorf("the call is not a GuestCall: %w", err)
	}
	return call, checkGuestCall(call)
}

// checkGuestCall applies the channel's bounds to a decoded call.
func checkGuestCall(call protocol.GuestCall) error {
	switch {
	case call.Method == "" || len(call.Method) > protocol.MaxGuestRequestMethodLen:
		return fmt.Errorf("a call needs a method of 1 to %d bytes", protocol.MaxGuestRequestMethodLen)
	case !utf8.ValidString(call.Method):
		return errors.New("the call's method is not UTF-8")
	case len(call.Params) > protocol.MaxGuestRequestParamsBytes:
		return fmt.Errorf("the call's params are %d bytes; at most %d are sent", len(call.Params), protocol.MaxGuestRequestParamsBytes)
	}
	return nil
}

// wait sends the call to the helper as a request event and waits for its
// answer, the caller hanging up, the backstop or the agent's end.
func (ep *endpoint) wait(conn *net.UnixConn, call protocol.GuestCall) protocol.Response {
	if ep.waiting.Add(1) > protocol.MaxGuestRequestsPerSession {
		ep.waiting.Add(-1)
		return protocol.Response{Error: fmt.Sprintf("too many guest requests of this process are waiting (%d)", protocol.MaxGuestRequestsPerSession)}
	}
	defer ep.waiting.Add(-1)
	id, answer, err := ep.r.add()
	if err != nil {
		return protocol.Response{Error: err.Error()}
	}
	defer ep.r.remove(id)
	ep.r.a.emit(protocol.Event{Type: protocol.EventRequest, ID: ep.spawnID, GuestRequest: &protocol.GuestRequest{
		ID: id, Method: call.Method, Params: call.Params, TimeoutMillis: call.TimeoutMillis,
	}})
	backstop := time.NewTimer(call.Timeout() + ep.r.backstop)
	defer backstop.Stop()
	select {
	case res := <-answer:
		if res.Error != "" {
			return protocol.Response{Error: res.Error}
		}
		return protocol.Response{Success: true, Result: res.Result}
	case <-hangUp(conn):
		ep.r.a.log.Debug("a guest request's caller hung up", "id", ep.spawnID, "request", id)
		return protocol.Response{Error: "the caller hung up"}
	case <-backstop.C:
		return protocol.Response{Error: fmt.Sprintf("no answer from the helper within %v", call.Timeout()+ep.r.backstop)}
	}
}

// hangUp returns a channel closed when the caller closes its end (or sends
// more than its one call, which ends it too).
func hangUp(conn *net.UnixConn) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b [1]byte
		_, _ = conn.Read(b[:])
	}()
	return done
}

// add registers a waiting call under a new number.
func (r *guestRequests) add() (uint64, chan protocol.GuestResponseParams, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, nil, errors.New("the guest agent is shutting down")
	}
	r.next++
	ch := make(chan protocol.GuestResponseParams, 1)
	r.waiting[r.next] = ch
	return r.next, ch, nil
}

func (r *guestRequests) remove(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiting, id)
}

// answer hands the helper's guestResponse to its waiting call.
func (r *guestRequests) answer(p protocol.GuestResponseParams) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.waiting[p.ID]
	if !ok {
		return fmt.Errorf("guest request %s: %w", strconv.FormatUint(p.ID, 10), errGuestCallerGone)
	}
	delete(r.waiting, p.ID)
	ch <- p // buffered, and only one answer per call
	return nil
}

// closeAll answers every waiting call with an error and refuses new ones.
func (r *guestRequests) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for id, ch := range r.waiting {
		ch <- protocol.GuestResponseParams{ID: id, Error: "the guest agent is shutting down"}
		delete(r.waiting, id)
	}
}
