package helper

// Guest requests: a process in the guest asks the desktop client something
// (the channel is described in protocol/agent.go). The agent's request
// event names the spawn and the agent's number for the call. The helper
// checks it (a process of that guest; method and params within bounds; at
// most protocol.MaxGuestRequestsPerSession waiting per session and
// maxGuestRequestsPerProfile per profile; a session's rate limit; the
// profile's undelivered events within guestRequestBudget bytes), gives it
// an id of its own and publishes {type:"request", id, method, params} to
// the spawn's profile. The
// client's sendGuestResponse with that id — a JSON string or number — is the
// answer the agent gets (guestResponse); when the call's timeout passes
// first (protocol.GuestRequestTimeout of what the caller asked: 1 s to
// 30 min), the agent gets an error instead and the id is forgotten. When the
// guest ends, its requests are forgotten (dropGuest). An id not waiting, or
// another profile's, is refused.
//
// Ids are decimal integers from a counter that starts at the helper's start
// time in milliseconds × 1024: unique across profiles and, short of 1024
// requests a millisecond, across helper restarts, so an answer to a request
// of an earlier helper finds nothing instead of another call. They stay below
// 2^53, exact in the client's JavaScript numbers.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// maxGuestRequestsPerProfile bounds one profile's guest requests waiting
// for the client, all sessions together.
const maxGuestRequestsPerProfile = 256

// A session's guest requests are rate-limited by a token bucket: at most
// guestRequestBurst at once, guestRequestRate a second after that; the
// excess is refused to the guest. A loop in the guest cannot flood the
// client with request events.
const (
	guestRequestBurst = 2 * protocol.MaxGuestRequestsPerSession
	guestRequestRate  = 16
	// maxIdleBuckets: past this many sessions' buckets, the full ones
	// (idle sessions) are forgotten.
	maxIdleBuckets = 256
)

// tokenBucket is one session's rate limit.
type tokenBucket struct {
	tokens float64
	at     time.Time
}

// refill adds the tokens earned since the last call, up to the burst.
func (b *tokenBucket) refill(now time.Time) {
	b.tokens = min(guestRequestBurst, b.tokens+now.Sub(b.at).Seconds()*guestRequestRate)
	b.at = now
}

// guestRequestSeq numbers the helper's guest requests (see above).
var guestRequestSeq = func() *atomic.Uint64 {
	var n atomic.Uint64
	n.Store(uint64(time.Now().UnixMilli()) << 10)
	return &n
}()

// guestRequest is one request waiting for the client.
type guestRequest struct {
	id      string // the client's
	s       *Service
	inst    *guestInstance
	session string
	spawn   string
	agentID uint64 // the agent's
	method  string
	timer   *time.Timer // the timeout; set under the table's lock
}

// guestRequestTable holds every profile's waiting requests: a Service has no
// field for them, and ids are helper-wide anyway.
type guestRequestTable struct {
	mu      sync.Mutex
	byID    map[string]*guestRequest
	buckets map[sessionKey]*tokenBucket
}

var guestRequests = &guestRequestTable{byID: make(map[string]*guestRequest), buckets: make(map[sessionKey]*tokenBucket)}

// allow takes a token from the session's bucket; false: over its rate.
// Called with t.mu held.
func (t *guestRequestTable) allow(key sessionKey, now time.Time) bool {
	if len(t.buckets) > maxIdleBuckets {
		for k, b := range t.buckets {
			if b.refill(now); b.tokens >= guestRequestBurst {
				delete(t.buckets, k)
			}
		}
	}
	b := t.buckets[key]
	if b == nil {
		b = &tokenBucket{tokens: guestRequestBurst, at: now}
		t.buckets[key] = b
	}
	b.refill(now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

type sessionKey struct {
	s       *Service
	session string
}

// add registers r, with its timeout, unless its session or profile has as
// many waiting as allowed. Requests of a guest that has ended are dropped
// first (nobody waits for them any more).
func (t *guestRequestTable) add(r *guestRequest, timeout time.Duration, expire func()) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	inSession, inProfile := 0, 0
	for id, q := range t.byID {
		if q.inst.ending.Load() {
			q.timer.Stop()
			delete(t.byID, id)
			continue
		}
		if q.s == r.s {
			inProfile++
			if q.session == r.session {
				inSession++
			}
		}
	}
	switch {
	case inSession >= protocol.MaxGuestRequestsPerSession:
		return fmt.Errorf("session %s has %d guest requests waiting for the client already", r.session, inSession)
	case inProfile >= maxGuestRequestsPerProfile:
		return fmt.Errorf("the profile has %d guest requests waiting for the client already", inProfile)
	case !t.allow(sessionKey{r.s, r.session}, time.Now()):
		return fmt.Errorf("session %s sends guest requests faster than %d a second (bursts of %d); refused", r.session, guestRequestRate, guestRequestBurst)
	}
	r.id = strconv.FormatUint(guestRequestSeq.Add(1), 10)
	r.timer = time.AfterFunc(timeout, expire)
	t.byID[r.id] = r
	return nil
}

// take removes and returns the request id of s, nil if s has none waiting.
func (t *guestRequestTable) take(s *Service, id string) *guestRequest {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.byID[id]
	if r == nil || r.s != s {
		return nil
	}
	delete(t.byID, id)
	r.timer.Stop()
	if r.inst.ending.Load() {
		return nil // its guest is being torn down (dropGuest)
	}
	return r
}

// dropGuest forgets the requests of inst, a guest being torn down, and
// stops their timers: nobody is left to answer, and a sendGuestResponse
// for one finds nothing waiting. It returns how many there were.
func (t *guestRequestTable) dropGuest(inst *guestInstance) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for id, r := range t.byID {
		if r.inst == inst {
			r.timer.Stop()
			delete(t.byID, id)
			n++
		}
	}
	return n
}

// waiting counts s's requests waiting for the client (tests).
func (t *guestRequestTable) waiting(s *Service) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, r := range t.byID {
		if r.s == s {
			n++
		}
	}
	return n
}

// onGuestRequest handles the agent's request event ev: a call of the spawn
// ev.ID. It runs on the agent's read loop, so answers to the agent go out
// from other goroutines.
func (s *Service) onGuestRequest(inst *guestInstance, ev protocol.Event) {
	g := ev.GuestRequest
	if g == nil || g.ID == 0 {
		s.log.Debug("agent request event without its request dropped", "id", ev.ID)
		return
	}
	refuse := func(err error) {
		s.log.Info("guest request refused", "id", ev.ID, "method", g.Method, "err", err)
		go inst.answerGuest(g.ID, nil, err.Error())
	}
	s.mu.Lock()
	p := s.procs.get(ev.ID)
	s.mu.Unlock()
	// A process that has exited still counts: its background children may
	// ask too.
	if p == nil || p.guest != inst {
		refuse(fmt.Errorf("no process %q of this guest", ev.ID))
		return
	}
	params, err := checkGuestRequest(g)
	if err != nil {
		refuse(err)
		return
	}
	r := &guestRequest{s: s, inst: inst, session: p.session, spawn: p.id, agentID: g.ID, method: g.Method}
	timeout := protocol.GuestRequestTimeout(g.TimeoutMillis)
	if err := guestRequests.add(r, timeout, func() { s.expireGuestRequest(r, timeout) }); err != nil {
		refuse(err)
		return
	}
	ev = protocol.Event{Type: protocol.EventRequest, ID: r.id, Method: r.method, Params: params}
	if err := s.hub.PublishWithin(ev, guestRequestBudget); err != nil {
		guestRequests.take(s, r.id)
		_, owed := s.hub.heldBytes()
		refuse(fmt.Errorf("%w (%d bytes of events waiting); guest request refused", err, owed))
		return
	}
	s.log.Info("guest request", "id", r.id, "process", r.spawn, "session", r.session, "method", r.method, "timeout", timeout)
}

// checkGuestRequest applies the channel's bounds (the guest is not
// trusted) and returns the params to publish ({} when it sent none).
func checkGuestRequest(g *protocol.GuestRequest) (json.RawMessage, error) {
	switch {
	case g.Method == "" || len(g.Method) > protocol.MaxGuestRequestMethodLen || !utf8.ValidString(g.Method):
		return nil, fmt.Errorf("a guest request needs a method of 1 to %d bytes", protocol.MaxGuestRequestMethodLen)
	case len(g.Params) > protocol.MaxGuestRequestParamsBytes:
		return nil, fmt.Errorf("the guest request's params are %d bytes, more than %d", len(g.Params), protocol.MaxGuestRequestParamsBytes)
	case len(g.Params) == 0:
		return json.RawMessage("{}"), nil
	}
	return g.Params, nil
}

// expireGuestRequest answers a request the client left unanswered for its
// timeout.
func (s *Service) expireGuestRequest(r *guestRequest, timeout time.Duration) {
	if guestRequests.take(s, r.id) != r {
		return // answered meanwhile
	}
	s.log.Info("guest request timed out", "id", r.id, "process", r.spawn, "method", r.method, "timeout", timeout)
	r.inst.answerGuest(r.agentID, nil, fmt.Sprintf("no response from the client within %v", timeout))
}

// answerGuest sends the agent the answer to its request id.
func (inst *guestInstance) answerGuest(id uint64, result json.RawMessage, errMsg string) {
	err := inst.call(protocol.AgentMethodGuestResponse, protocol.GuestResponseParams{ID: id, Result: result, Error: errMsg}, nil)
	if err != nil {
		// Its caller hung up, or the guest is gone: nobody to tell.
		inst.s.log.Info("a guest request's answer did not reach its caller", "request", id, "err", err)
	}
}

// sendGuestResponse is the client's answer to the request p.ID: p.Error,
// or else the result p.ResultJSON (a JSON text in a string, or a value).
func (s *Service) sendGuestResponse(_ context.Context, p protocol.SendGuestResponseParams) (empty, error) {
	r := guestRequests.take(s, string(p.ID))
	if r == nil {
		return nil, fmt.Errorf("sendGuestResponse: no guest request %q is waiting (answered already, timed out, its guest ended, or never asked)", string(p.ID))
	}
	result, errMsg, err := guestResult(p)
	if err != nil {
		r.inst.answerGuest(r.agentID, nil, "the client's response could not be passed on: "+err.Error())
		return nil, fmt.Errorf("sendGuestResponse %s: %w", r.id, err)
	}
	s.log.Info("guest request answered", "id", r.id, "process", r.spawn, "method", r.method, "error", errMsg != "")
	r.inst.answerGuest(r.agentID, result, errMsg)
	return nil, nil
}

// guestResult turns a sendGuestResponse into the guest's answer: the error
// if there is one; else the result, a string holding JSON being that JSON
// (a string holding anything else stays that string), nothing being null.
func guestResult(p protocol.SendGuestResponseParams) (json.RawMessage, string, error) {
	if p.Error != "" {
		return nil, p.Error, nil
	}
	raw := p.ResultJSON
	if len(raw) > protocol.MaxGuestResponseBytes {
		return nil, "", fmt.Errorf("resultJson is %d bytes, more than the %d a guest request's answer may have", len(raw), protocol.MaxGuestResponseBytes)
	}
	if len(raw) == 0 || string(raw) == "null" {
		return nil, "", nil
	}
	if raw[0] == '"' {
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, "", errors.New("resultJson is not a JSON string")
		}
		if json.Valid([]byte(text)) {
			return json.RawMessage(text), "", nil
		}
	}
	return raw, "", nil
}

// oomKillCount passes an exit's oomKillCount on when it is a count the
// guest can mean: 0 to protocol.MaxOOMKillCount (else none).
func oomKillCount(n *int) *int {
	if n == nil || *n < 0 || *n > protocol.MaxOOMKillCount {
		return nil
	}
	return ptr(*n)
}
