package helper

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// DefaultBacklog is how many events already delivered the hub keeps for
// subscribers that arrive after the fact (a second live subscriber).
const DefaultBacklog = 1024

// MaxBacklogBytes bounds the memory of the events a hub holds, each counted
// by eventSize (its whole payload and a fixed overhead): events already
// delivered go first, then superseded status events. Events not yet
// delivered that the client is owed — output, exits, errors, guest
// requests — are never evicted to make room: output is bounded by the
// credit it holds (outputWindow × maxRunningProcesses, see flow.go), guest
// requests are refused past their share (guestRequestBudget), exits and
// errors are one or two small events per process.
const MaxBacklogBytes = 32 << 20

// hardBacklogBytes is the backstop: past it the oldest events go whatever
// their type (logged as an error). The bounds above keep a hub far below it.
const hardBacklogBytes = 2 * MaxBacklogBytes

// eventOverhead is what an event costs beyond its strings: the Event
// value, the hub's bookkeeping, the frame's JSON keys.
const eventOverhead = 256

// ErrSubscriptionClosed is returned by Subscription.Next after Close.
var ErrSubscriptionClosed = errors.New("helper: event subscription closed")

// errBacklogFull refuses an event that would take the undelivered events
// past the limit given to PublishWithin.
var errBacklogFull = errors.New("the client is not reading its events")

// Hub fans one profile's events out to its subscribers (every profile has
// a Hub of its own: no event of one reaches another's subscribers).
//
// Design: one queue of events, each with a sequence number. A subscriber is
// only a cursor into that queue. The hub keeps an "acked" cursor: the
// sequence number up to which some subscriber has written events to its
// client (a subscriber acknowledges an event by asking for the next one, or
// by Ack). Events below it are delivered and kept only for a second live
// subscriber, at most backlog of them and within MaxBacklogBytes; one that
// falls behind them skips ahead (and the loss is logged). Events at or past
// it are owed to the client and kept (see MaxBacklogBytes for their bounds).
// A subscriber that arrives while no other is live starts at the acked
// cursor, so events emitted while nobody listened, or the one whose write
// failed on a dropped connection, are replayed exactly once (the very first
// subscriber gets them all: the events of a guest started before the first
// subscription are not lost); one that arrives while another is live starts
// at the newest event, as the contract says.
type Hub struct {
	log     *slog.Logger
	backlog int
	// onDelivered, when set, is called (without the hub's lock) for each
	// output event once delivered, or evicted undelivered by the backstop,
	// with the credit it was published with (PublishOutput).
	onDelivered func(id string, credit int)

	mu      sync.Mutex
	events  []heldEvent // events[i] has sequence number first+i
	first   uint64      // sequence number of the oldest event kept
	next    uint64      // sequence number of the next event published
	bytes   int         // eventSize summed over the events kept
	owed    int         // eventSize summed over the events kept at or past acked
	wake    chan struct{}
	acked   uint64 // every event below this has been delivered by a subscriber
	live    int    // subscribers currently open
	evicted bool   // an event was evicted undelivered (logged once)
}

// heldEvent is one event in the queue.
type heldEvent struct {
	ev     protocol.Event
	size   int  // eventSize(ev)
	credit int  // flow-control credit it holds (output events)
	gone   bool // evicted from the middle of the queue (a superseded status event)
}

// NewHub returns a hub keeping up to backlog delivered events
// (DefaultBacklog if <= 0).
func NewHub(backlog int, log *slog.Logger) *Hub {
	if backlog <= 0 {
		backlog = DefaultBacklog
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Hub{log: log, backlog: backlog, wake: make(chan struct{})}
}

// eventSize estimates the memory an event holds: its strings, its params
// and eventOverhead.
func eventSize(ev protocol.Event) int {
	n := eventOverhead + len(ev.Type) + len(ev.ID) + len(ev.Data) + len(ev.Signal) +
		len(ev.Message) + len(ev.Status) + len(ev.Step) + len(ev.Method)
	switch p := ev.Params.(type) {
	case nil:
	case json.RawMessage:
		n += len(p)
	case string:
		n += len(p)
	default:
		b, _ := json.Marshal(p)
		n += len(b)
	}
	return n
}

// Publish appends one event and wakes every subscriber. It never blocks on a
// subscriber.
func (h *Hub) Publish(ev protocol.Event) { h.publish(ev, 0, -1) }

// PublishOutput publishes an output event holding credit bytes of its
// process's flow-control window, given back through onDelivered.
func (h *Hub) PublishOutput(ev protocol.Event, credit int) { h.publish(ev, credit, -1) }

// PublishWithin publishes ev unless the events owed to the client would
// then hold more than limit bytes; it returns errBacklogFull if so.
func (h *Hub) PublishWithin(ev protocol.Event, limit int) error {
	if !h.publish(ev, 0, limit) {
		return errBacklogFull
	}
	return nil
}

func (h *Hub) publish(ev protocol.Event, credit, limit int) bool {
	size := eventSize(ev)
	h.mu.Lock()
	if limit >= 0 && h.owed+size > limit {
		h.mu.Unlock()
		return false
	}
	h.events = append(h.events, heldEvent{ev: ev, size: size, credit: credit})
	h.next++
	h.bytes += size
	h.owed += size
	lost := h.trim()
	close(h.wake)
	h.wake = make(chan struct{})
	h.mu.Unlock()
	h.deliver(lost)
	return true
}

// trim evicts what the bounds say must go: delivered events past the
// backlog or the byte cap, then superseded status events, then (backstop)
// undelivered output, then anything. It returns the output events evicted undelivered, whose credit
// must still be given back. Called with h.mu held.
func (h *Hub) trim() []heldEvent {
	for h.first < h.acked && (int(h.next-h.first) > h.backlog || h.bytes > MaxBacklogBytes) {
		h.popFront()
	}
	if h.bytes > MaxBacklogBytes {
		h.evictUndelivered(MaxBacklogBytes, isStatusEvent)
	}
	if h.bytes <= hardBacklogBytes {
		return nil
	}
	h.log.Error("event backlog over its hard bound; dropping undelivered output", "bytes", h.bytes)
	lost := h.evictUndelivered(hardBacklogBytes, isOutputEvent)
	for h.bytes > hardBacklogBytes && h.first < h.next {
		e := h.events[0]
		if !e.gone {
			h.log.Error("event backlog over its hard bound; dropping an undelivered event", "type", e.ev.Type, "id", e.ev.ID)
			lost = append(lost, e)
		}
		h.popFront()
	}
	return lost
}

// popFront removes the oldest event kept. Called with h.mu held.
func (h *Hub) popFront() {
	e := h.events[0]
	h.events[0] = heldEvent{}
	h.events = h.events[1:]
	h.bytes -= e.size
	if h.first >= h.acked {
		h.owed -= e.size
		h.acked = h.first + 1
	}
	h.first++
}

// evictUndelivered drops undelivered events of the kinds evictable says,
// oldest first, until the hub holds at most limit bytes, and returns them.
// Called with h.mu held.
func (h *Hub) evictUndelivered(limit int, evictable func(string) bool) []heldEvent {
	var out []heldEvent
	for i := int(h.acked - h.first); i < len(h.events) && h.bytes > limit; i++ {
		e := &h.events[i]
		if e.gone || !evictable(e.ev.Type) {
			continue
		}
		if !h.evicted {
			h.evicted = true
			h.log.Warn("event backlog full; dropping undelivered events", "type", e.ev.Type)
		}
		out = append(out, *e)
		h.bytes -= e.size
		h.owed -= e.size
		*e = heldEvent{gone: true}
	}
	return out
}

func isOutputEvent(t string) bool { return t == protocol.EventStdout || t == protocol.EventStderr }

func isStatusEvent(t string) bool {
	switch t {
	case protocol.EventNetworkStatus, protocol.EventAPIReachability, protocol.EventStartupStep:
		return true
	}
	return false
}

// Subscribe opens a subscription. See Hub for where it starts.
func (h *Hub) Subscribe() *Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	start := h.next
	if h.live == 0 {
		start = max(h.acked, h.first)
	}
	h.live++
	return &Subscription{hub: h, cursor: start, closed: make(chan struct{})}
}

// delivered says whether a live subscriber has taken every event
// published (true as well when none is live: the backlog keeps them).
func (h *Hub) delivered() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.live == 0 || h.acked >= h.next
}

// heldBytes is what the hub's events hold, and of that what is owed to
// the client (tests, logs).
func (h *Hub) heldBytes() (all, owed int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bytes, h.owed
}

// ack records that every event below cursor has been delivered and returns
// the output events among them, whose credit goes back (deliver). Called
// with h.mu held.
func (h *Hub) ack(cursor uint64) []heldEvent {
	if cursor <= h.acked {
		return nil
	}
	var out []heldEvent
	for seq := max(h.acked, h.first); seq < cursor; seq++ {
		e := h.events[seq-h.first]
		h.owed -= e.size
		if e.credit > 0 {
			out = append(out, e)
		}
	}
	h.acked = cursor
	if lost := h.trim(); len(lost) > 0 {
		out = append(out, lost...)
	}
	return out
}

// deliver gives back the credit of output events delivered or lost. Called
// without h.mu.
func (h *Hub) deliver(events []heldEvent) {
	if h.onDelivered == nil {
		return
	}
	for _, e := range events {
		if e.credit > 0 {
			h.onDelivered(e.ev.ID, e.credit)
		}
	}
}

// Subscription is one subscriber's cursor. Next and Close may be called from
// different goroutines; Next must not be called concurrently with itself.
type Subscription struct {
	hub    *Hub
	cursor uint64 // next sequence number to hand out

	closeOnce sync.Once
	closed    chan struct{}
}

// Next returns the next event, blocking until one is published, ctx ends or
// the subscription is closed. Calling Next acknowledges every event returned
// before (as Ack does).
func (s *Subscription) Next(ctx context.Context) (protocol.Event, error) {
	h := s.hub
	for {
		h.mu.Lock()
		done := h.ack(s.cursor)
		if oldest := h.first; s.cursor < oldest {
			h.log.Warn("event subscriber fell behind; events dropped", "dropped", oldest-s.cursor)
			s.cursor = oldest
		}
		for s.cursor < h.next && h.events[s.cursor-h.first].gone {
			s.cursor++
		}
		if s.cursor < h.next {
			ev := h.events[s.cursor-h.first].ev
			s.cursor++
			h.mu.Unlock()
			h.deliver(done)
			return ev, nil
		}
		wake := h.wake
		h.mu.Unlock()
		h.deliver(done)
		select {
		case <-wake:
		case <-s.closed:
			return protocol.Event{}, ErrSubscriptionClosed
		case <-ctx.Done():
			return protocol.Event{}, ctx.Err()
		}
	}
}

// Ack acknowledges every event returned so far: call it once an event has
// been written to the client, so a resubscription after a drop neither loses
// nor repeats it.
func (s *Subscription) Ack() {
	s.hub.mu.Lock()
	done := s.hub.ack(s.cursor)
	s.hub.mu.Unlock()
	s.hub.deliver(done)
}

// Close ends the subscription. An event returned by Next but not yet
// acknowledged (by Ack or a later Next) is handed to the next subscriber
// again: its write probably failed.
func (s *Subscription) Close() {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.hub.mu.Lock()
		s.hub.live--
		s.hub.mu.Unlock()
	})
}
