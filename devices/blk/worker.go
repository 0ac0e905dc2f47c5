package blk

import (
	"errors"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// Request status codes (virtio 1.2 §5.2.6).
const (
	statusOK     byte = 0 // VIRTIO_BLK_S_OK
	statusIOErr  byte = 1 // VIRTIO_BLK_S_IOERR
	statusUnsupp byte = 2 // VIRTIO_BLK_S_UNSUPP
)

// worker serves the request queue of one activation: it owns the queue,
// guest memory and scratch space until the device is reset.
type worker struct {
	d      *Device
	mem    virtio.GuestMemory
	slicer virtio.Slicer
	q      *virtio.Queue
	irq    virtio.Interrupt

	// Negotiated behaviour.
	writethrough bool // FLUSH not negotiated: sync every write
	discard      bool // T_DISCARD negotiated
	writeZeroes  bool // T_WRITE_ZEROES negotiated

	iov    [][]byte // the current request's data segments
	hdr    [headerSize]byte
	seg    [segmentSize]byte
	status [1]byte
}

func newWorker(d *Device, mem virtio.GuestMemory, slicer virtio.Slicer, q *virtio.Queue, irq virtio.Interrupt, features uint64) *worker {
	return &worker{
		d: d, mem: mem, slicer: slicer, q: q, irq: irq,
		writethrough: features&FeatureFlush == 0,
		discard:      features&FeatureDiscard != 0,
		writeZeroes:  features&FeatureWriteZeroes != 0,
		iov:          make([][]byte, 0, SegMax),
	}
}

// serve drains the queue, first at once (a restored device may find
// requests made available before the snapshot), then at each wake.
func (w *worker) serve(wake, stop <-chan struct{}) {
	for {
		if !w.drain(stop) {
			return // queue broken or stopping
		}
		select {
		case <-wake:
		case <-stop:
			return
		}
	}
}

// drain answers every available request; it reports false once the queue
// is broken or stop is closed. Each answer is signalled at once: a request
// can take a while, and the driver should not wait for the rest of the
// batch. stop is checked between requests, so that a guest that keeps
// the queue full cannot hold up Reset.
func (w *worker) drain(stop <-chan struct{}) bool {
	for {
		select {
		case <-stop:
			return false
		default:
		}
		chain, err := w.q.Pop()
		var chainErr *virtio.ChainError
		switch {
		case errors.As(err, &chainErr):
			w.d.log.Warn("virtio-blk: refused a request", "err", err)
			if w.q.NeedsInterrupt() {
				w.irq.SignalUsed()
			}
			continue
		case err != nil:
			w.irq.NeedsReset(err)
			return false
		case chain == nil:
			return true
		}
		if err := w.q.Complete(chain, w.answer(chain), w.irq); err != nil {
			w.irq.NeedsReset(err)
			return false
		}
	}
}

// answer serves one request and writes its status byte, the last
// writable byte of the chain. It returns the used length: the data bytes
// written into the guest's buffers plus the status byte. A chain with no
// writable byte cannot be told anything and gets 0.
func (w *worker) answer(chain *virtio.Chain) uint32 {
	writable := chain.Writable()
	if len(writable) == 0 {
		w.d.log.Warn("virtio-blk: refused a request without a status byte", "head", chain.Head())
		return 0
	}
	status, written := w.execute(chain)
	last := writable[len(writable)-1]
	w.status[0] = status
	if err := w.mem.WriteAt(w.status[:], last.Addr+uint64(last.Len)-1); err != nil {
		w.d.log.Warn("virtio-blk: writing a request's status failed", "err", err)
		return 0
	}
	return written + 1
}
