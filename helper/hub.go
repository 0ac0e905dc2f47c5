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

// Hub fans one profile's events out to its subscribers (every profile has
// a Hub of its own: no event of one reaches another's subscribers).
//
// Design: one ring of the last N events, each with a sequence number. A
// subscriber is only a cursor into that ring, so a slow subscriber costs no
// memory; one that falls more than N events behind skips ahead (and the loss
// is logged). The hub keeps an "acked" cursor: the sequence number up to
// which some subscriber has finished handling events (a subscriber
// acknowledges an event by asking for the next one, or by Ack). A
// subscriber that arrives while no other is live starts at that acked
// cursor, so events emitted while nobody listened, or the one whose write
// failed on a dropped connection, are replayed exactly once (the very first
// subscriber gets the whole backlog: the events of a guest started before
// the first subscription are not lost); one that arrives while another is
// live starts at the newest event, as the contract says.
type Hub struct {
	log *slog.Logger

	mu    sync.Mutex
	ring  []protocol.Event // len == capacity; ring[seq % cap]
	first uint64           // sequence number of the oldest event kept
	next  uint64           // sequence number of the next event published
	bytes int              // len(Data) summed over the events kept
	wake  chan struct{}    // closed and replaced on every publish
	acked uint64           // every event below this has been handled by a subscriber
	live  int              // subscribers currently open
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
		log:  log,
		ring: make([]protocol.Event, backlog),
		wake: make(chan struct{}),
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

// ack records that every event below cursor has been handled. Called with
// h.mu held.
func (h *Hub) ack(cursor uint64) {
	if cursor > h.acked {
		h.acked = cursor
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
		h.ack(s.cursor)
		if oldest := h.first; s.cursor < oldest {
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
	s.hub.ack(s.cursor)
	s.hub.mu.Unlock()
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
