package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// maxEvents bounds what one run keeps of its event stream (a run makes a
// few dozen; a chatty guest must not grow the bench without bound).
const maxEvents = 10000

// timedEvent is an event with the time the bench received it.
type timedEvent struct {
	ev protocol.Event
	at time.Time
}

// eventLog is the events of one run, appended by the subscription's reader
// and waited on by the driver.
type eventLog struct {
	mu      sync.Mutex
	events  []timedEvent
	changed chan struct{} // closed and replaced on every append
	err     error         // why the stream ended
	// onEvent, when set before read starts, is called with each event as
	// it arrives (the work accounting samples at the boot timer's).
	onEvent func(protocol.Event)
}

func newEventLog() *eventLog { return &eventLog{changed: make(chan struct{})} }

func (l *eventLog) add(ev protocol.Event, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.events) < maxEvents {
		l.events = append(l.events, timedEvent{ev, at})
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *eventLog) end(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.err = err
	close(l.changed)
	l.changed = make(chan struct{})
}

// read appends every event of stream to the log until it ends.
func (l *eventLog) read(stream *protocol.EventStream) {
	for {
		ev, err := stream.Next()
		if err != nil {
			l.end(err)
			return
		}
		l.add(ev, time.Now())
		if l.onEvent != nil {
			l.onEvent(ev)
		}
	}
}

// wait returns the first event that match accepts, waiting for it. A fatal
// error event ends the wait with its message.
func (l *eventLog) wait(ctx context.Context, what string, match func(protocol.Event) bool) (timedEvent, error) {
	for {
		l.mu.Lock()
		for _, te := range l.events {
			if match(te.ev) {
				l.mu.Unlock()
				return te, nil
			}
			if te.ev.Type == protocol.EventError && te.ev.Fatal != nil && *te.ev.Fatal {
				l.mu.Unlock()
				return timedEvent{}, fmt.Errorf("waiting for %s: the helper reported: %s", what, te.ev.Message)
			}
		}
		changed, err := l.changed, l.err
		l.mu.Unlock()
		if err != nil {
			return timedEvent{}, fmt.Errorf("waiting for %s: the event subscription ended: %w", what, err)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return timedEvent{}, fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
}

// snapshot returns the events received so far.
func (l *eventLog) snapshot() []timedEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]timedEvent(nil), l.events...)
}
