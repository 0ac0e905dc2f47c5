package helper

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"sync"
	"time"
)

// Session sizes. getSessionsDiskInfo must answer within the client's 30 s
// timeout however large the sessions are, so it never walks every session
// tree: each profile keeps the size of each of its sessions, measured by
// one background worker (beneath.SizeOf, by descriptor beneath the
// sessions directory), and re-measures a session only when it may have
// changed:
//
//   - when it is first seen (at the profile's start, or listed by a call);
//   - when one of its processes ends (the guest wrote what it wrote);
//   - while a process of it runs, when a call finds its size older than
//     busySizeAge;
//   - after pruneSessionCaches removed something from it;
//   - when a call finds its size older than idleSizeAge (changes made on
//     the host behind the helper's back).
//
// A call answers with the sizes known. It waits, at most sizeWaitBudget,
// for sessions never measured, and — when the free space it would report
// is below the client's lowWaterBytes, i.e. the client is about to reclaim
// space by these figures — has every busy session measured afresh and
// waits for every re-measure pending.

const (
	busySizeAge    = 10 * time.Second
	idleSizeAge    = 10 * time.Minute
	sizeWaitBudget = 20 * time.Second
)

// sizeCache holds one profile's session sizes and the queue of sessions to
// measure. Safe for concurrent use; its lock is taken last.
type sizeCache struct {
	// measure sizes a session; ok is false when it no longer exists.
	measure func(name string) (bytes int64, ok bool)
	log     *slog.Logger

	mu      sync.Mutex
	sizes   map[string]sessionSize
	queue   []string        // sessions to measure, in order
	queued  map[string]bool // what queue holds
	gen     map[string]int  // bumped by forget: a measure begun before is dropped
	working bool            // the worker runs
	current string          // the session being measured ("" when none)
	changed chan struct{}   // closed and replaced after every measure
	closed  bool
	done    chan struct{} // closed when a worker ends after close
	walks   int           // measures made (tests)
}

type sessionSize struct {
	bytes int64
	at    time.Time
}

func newSizeCache(measure func(string) (int64, bool), log *slog.Logger) *sizeCache {
	return &sizeCache{
		measure: measure, log: log,
		sizes: map[string]sessionSize{}, queued: map[string]bool{}, gen: map[string]int{},
		changed: make(chan struct{}),
	}
}

// prime queues every session list returns (at the profile's start, in the
// background: the first call finds most of them measured).
func (c *sizeCache) prime(list func() ([]string, error)) {
	go func() {
		names, err := list()
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				c.log.Warn("cannot list the sessions to measure them", "err", err)
			}
			return
		}
		for _, n := range names {
			c.stale(n)
		}
	}()
}

// stale queues a session to be measured again.
func (c *sizeCache) stale(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.enqueueLocked(name)
}

func (c *sizeCache) enqueueLocked(name string) {
	if c.closed || c.queued[name] {
		return
	}
	c.queued[name] = true
	c.queue = append(c.queue, name)
	if !c.working {
		c.working = true
		go c.work()
	}
}

// forget drops a deleted session.
func (c *sizeCache) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sizes, name)
	c.gen[name]++
}

// work measures queued sessions, one at a time, until the queue is empty
// or the cache closed.
func (c *sizeCache) work() {
	for {
		c.mu.Lock()
		if c.closed || len(c.queue) == 0 {
			c.working = false
			if c.closed && c.done != nil {
				close(c.done)
				c.done = nil
			}
			c.mu.Unlock()
			return
		}
		name := c.queue[0]
		c.queue = c.queue[1:]
		delete(c.queued, name)
		c.current = name
		gen := c.gen[name]
		c.mu.Unlock()

		bytes, ok := c.measure(name)

		c.mu.Lock()
		c.current = ""
		c.walks++
		if c.gen[name] == gen {
			if ok {
				c.sizes[name] = sessionSize{bytes: bytes, at: time.Now()}
			} else {
				delete(c.sizes, name)
			}
		}
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
	}
}

// lookup returns the known sizes of names (listed sessions) and queues
// those never measured, those of busy sessions older than busySizeAge and
// any older than idleSizeAge. missing lists the names without a size.
func (c *sizeCache) lookup(names []string, busy map[string]bool) (sizes map[string]int64, missing []string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	sizes = make(map[string]int64, len(names))
	for _, n := range names {
		e, ok := c.sizes[n]
		switch {
		case !ok:
			missing = append(missing, n)
			if c.current != n {
				c.enqueueLocked(n)
			}
			continue
		case c.current == n:
			// Being measured: that measure is fresh enough.
		case busy[n] && now.Sub(e.at) > busySizeAge, now.Sub(e.at) > idleSizeAge:
			c.enqueueLocked(n)
		}
		sizes[n] = e.bytes
	}
	return sizes, missing
}

// wait blocks until every one of names is settled — neither queued nor
// being measured — or, unless all, has a size; or until ctx ends or the
// cache is closed.
func (c *sizeCache) wait(ctx context.Context, names []string, all bool) {
	for {
		c.mu.Lock()
		ready := c.closed
		if !ready {
			ready = true
			for _, n := range names {
				_, sized := c.sizes[n]
				if (c.queued[n] || c.current == n) && (all || !sized) {
					ready = false
					break
				}
			}
		}
		changed := c.changed
		c.mu.Unlock()
		if ready {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// walkCount is how many measures were made (tests).
func (c *sizeCache) walkCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.walks
}

// close stops the worker after its current measure and waits for it.
func (c *sizeCache) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	var done chan struct{}
	if c.working {
		done = make(chan struct{})
		c.done = done
	}
	c.mu.Unlock()
	if done != nil {
		<-done
	}
}
