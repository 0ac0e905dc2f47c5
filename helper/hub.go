package helper

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// DefaultBacklog is how many recent events the hub keeps for subscribers
// that arrive after the fact.
const DefaultBacklog = 1024

// MaxBacklogBytes bounds the output data the backlog holds, whatever the
// guest sends: the oldest events are dropped first.
const MaxBacklogBytes = 32 << 20

// ErrSubscriptionClosed is returned by Subscription.Next after Close.
var ErrSubscriptionClosed = errors.New("helper: event subscription closed")

// Hub fans events out to subscribers.
//
// Design: one ring of the last N events, each with a global sequence number.
// A subscriber is only a cursor into that ring, so a slow subscriber costs no
// memory; one that falls more than N events behind skips ahead (and the loss
// is logged). Every profile (userDataName + userDataRoot) has an "acked"
// cursor: the sequence number up to which some subscriber of that profile has
// finished handling events (a subscriber acknowledges an event by asking for
// the next one). A subscriber that arrives while its profile has no live
// subscriber starts at that acked cursor, so events emitted while nobody
// listened, or the one whose write failed on a dropped connection, are
// replayed exactly once; one that arrives while another subscriber of its
// profile is live starts at the newest event, as the contract says.
type Hub struct {
	log *slog.Logger

	mu       sync.Mutex
	ring     []protocol.Event // len == capacity; ring[seq % cap]
	first    uint64           // sequence number of the oldest event kept
	next     uint64           // sequence number of the next event published
	bytes    int              // len(Data) summed over the events kept
	wake     chan struct{}    // closed and replaced on every publish
	profiles map[profileKey]*profileCursor
}

type profileKey struct{ name, root string }

type profileCursor struct {
	acked uint64 // every event below this has been handled by a subscriber
	live  int    // subscribers currently open
}

// NewHub returns a hub keeping the last backlog events (DefaultBacklog if <= 0).
func NewHub(backlog int, log *slog.Logger) *Hub {
	if backlog <= 0 {
		backlog = DefaultBacklog
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Hub{
		log:      log,
		ring:     make([]protocol.Event, backlog),
		wake:     make(chan struct{}),
		profiles: make(map[profileKey]*profileCursor),
	}
}

// Publish appends one event and wakes every subscriber. It never blocks on a
// subscriber.
func (h *Hub) Publish(ev protocol.Event) {
	h.mu.Lock()
	capacity := uint64(len(h.ring))
	for h.first < h.next && (h.next-h.first >= capacity || h.bytes+len(ev.Data) > MaxBacklogBytes) {
		h.bytes -= len(h.ring[h.first%capacity].Data)
		h.ring[h.first%capacity] = protocol.Event{}
		h.first++
	}
	h.ring[h.next%capacity] = ev
	h.bytes += len(ev.Data)
	h.next++
	close(h.wake)
	h.wake = make(chan struct{})
	h.mu.Unlock()
}

// oldest is the sequence number of the oldest event still in the ring.
func (h *Hub) oldest() uint64 { return h.first }

// Subscribe opens a subscription for one profile. See Hub for where it starts.
func (h *Hub) Subscribe(userDataName, userDataRoot string) *Subscription {
	key := profileKey{userDataName, userDataRoot}
	h.mu.Lock()
	defer h.mu.Unlock()
	pc := h.profiles[key]
	if pc == nil {
		// A profile never seen gets the whole backlog: the events of a VM
		// started before the first subscription are not lost.
		pc = &profileCursor{acked: h.oldest()}
		h.profiles[key] = pc
	}
	start := h.next
	if pc.live == 0 {
		start = max(pc.acked, h.oldest())
	}
	pc.live++
	return &Subscription{hub: h, profile: pc, cursor: start, closed: make(chan struct{})}
}

// Subscription is one subscriber's cursor. Next and Close may be called from
// different goroutines; Next must not be called concurrently with itself.
type Subscription struct {
	hub     *Hub
	profile *profileCursor
	cursor  uint64 // next sequence number to hand out

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
		if s.cursor > s.profile.acked {
			s.profile.acked = s.cursor
		}
		if oldest := h.oldest(); s.cursor < oldest {
			h.log.Warn("event subscriber fell behind; events dropped", "dropped", oldest-s.cursor)
			s.cursor = oldest
		}
		if s.cursor < h.next {
			ev := h.ring[s.cursor%uint64(len(h.ring))]
			s.cursor++
			h.mu.Unlock()
			return ev, nil
		}
		wake := h.wake
		h.mu.Unlock()
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
	if s.cursor > s.profile.acked {
		s.profile.acked = s.cursor
	}
	s.hub.mu.Unlock()
}

// Close ends the subscription. An event returned by Next but not yet
// acknowledged (by Ack or a later Next) is handed to the profile's next
// subscriber again: its write probably failed.
func (s *Subscription) Close() {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.hub.mu.Lock()
		s.profile.live--
		s.hub.mu.Unlock()
	})
}
