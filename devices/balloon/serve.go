package balloon

import (
	"errors"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// active is one activation's state, owned by its worker goroutine.
type active struct {
	mem       virtio.GuestMemory
	irq       virtio.Interrupt
	inflate   *virtio.Queue
	deflate   *virtio.Queue
	stats     *virtio.Queue // nil unless STATS_VQ was negotiated
	reporting *virtio.Queue // nil unless REPORTING was negotiated

	heldStats *virtio.Chain              // the driver's statistics buffer
	pfnBuf    [4 * MaxPagesPerChain]byte // page numbers of one chain
}

// serve is the worker: it drains every queue after each wake, and hands
// the statistics buffer back when asked.
func (d *Device) serve(a *active, wake, stop <-chan struct{}) {
	var tick <-chan time.Time
	if d.statsInterval > 0 && a.stats != nil {
		ticker := time.NewTicker(d.statsInterval)
		defer ticker.Stop()
		tick = ticker.C
	}
	for {
		if !d.serveOnce(a) {
			return // a queue broke; wait for the reset
		}
		select {
		case <-wake:
		case <-tick:
			d.statsWanted.Store(true)
		case <-stop:
			return
		}
	}
}

// serveOnce drains the queues and answers a statistics request; it reports
// false once a queue is broken (NeedsReset already called).
func (d *Device) serveOnce(a *active) bool {
	ok := d.drain(a, a.inflate, func(c *virtio.Chain) error {
		d.inflate(a, c)
		return a.inflate.Push(c, 0)
	}) && d.drain(a, a.deflate, func(c *virtio.Chain) error {
		d.deflate(a, c)
		return a.deflate.Push(c, 0)
	})
	if ok && a.reporting != nil {
		ok = d.drain(a, a.reporting, func(c *virtio.Chain) error {
			d.report(a, c)
			return a.reporting.Push(c, 0)
		})
	}
	if ok && a.stats != nil {
		ok = d.drain(a, a.stats, func(c *virtio.Chain) error { return d.holdStats(a, c) })
	}
	if ok && a.heldStats != nil && d.statsWanted.Swap(false) {
		ok = d.complete(a, a.stats, a.heldStats)
		a.heldStats = nil
	}
	return ok
}

// drain pops every available chain of q and hands it to handle, which
// returns it to the driver (or keeps it); an error from handle is a broken
// queue. It raises the used interrupt if the driver wants one and reports
// false once q is broken.
func (d *Device) drain(a *active, q *virtio.Queue, handle func(*virtio.Chain) error) bool {
	defer func() {
		if q.NeedsInterrupt() {
			a.irq.SignalUsed()
		}
	}()
	for {
		chain, err := q.Pop()
		var chainErr *virtio.ChainError
		switch {
		case errors.As(err, &chainErr):
			d.log.Warn("virtio-balloon: refused a descriptor chain", "err", err)
			continue
		case err != nil:
			a.irq.NeedsReset(err)
			return false
		case chain == nil:
			return true
		}
		if err := handle(chain); err != nil {
			a.irq.NeedsReset(err)
			return false
		}
	}
}

// complete returns one chain with used length 0 and signals if needed.
func (d *Device) complete(a *active, q *virtio.Queue, c *virtio.Chain) bool {
	if err := q.Complete(c, 0, a.irq); err != nil {
		a.irq.NeedsReset(err)
		return false
	}
	return true
}
