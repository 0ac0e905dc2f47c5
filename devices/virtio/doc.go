// Package virtio implements the device side of virtio 1.2 for cowork-vmm:
// split virtqueues ([Queue]) whose descriptor chains reach device code only
// after validation, as an [io.Reader] and an [io.Writer] ([Chain]); the small
// [Device] interface every virtio device implements; and the virtio-mmio
// version 2 transport ([MMIO]) that puts a Device on the VMM's bus.
//
// The guest is hostile. Every index, address and length read from guest
// memory is copied once into host memory and validated there: descriptor
// indices in range, chains no longer than the queue, no loops, no nested
// indirect tables, readable descriptors before writable ones, every buffer
// inside guest memory, total length capped, arithmetic that cannot overflow.
// A bad chain is completed with used length 0 and draining continues
// ([ChainError]); a broken ring (an available index that ran ahead by more
// than the queue size, a ring outside guest memory) makes the queue fail
// with [ErrQueueBroken], and the device reports it through
// [Interrupt.NeedsReset], which sets DEVICE_NEEDS_RESET. Nothing here panics
// on guest input.
//
// How a device is written (see package rng for the smallest example):
//
//	func (d *Dev) Activate(mem virtio.GuestMemory, irq virtio.Interrupt, queues []*virtio.Queue, features uint64) error {
//		// keep queues; start a worker goroutine
//	}
//	func (d *Dev) Notify(queue int) { /* wake the worker, never block */ }
//	// worker:
//	for {
//		chain, err := q.Pop()
//		var chainErr *virtio.ChainError
//		switch {
//		case errors.As(err, &chainErr): // already completed with length 0
//			logLimited(err)
//			continue
//		case err != nil: // ErrQueueBroken
//			irq.NeedsReset(err)
//			return
//		case chain == nil: // empty
//			wait for Notify
//		}
//		// use chain.Reader() / chain.Writer(), then:
//		q.Push(chain, chain.Writer().Written())
//		if q.NeedsInterrupt() { irq.SignalUsed() }
//	}
//
// Package virtio/virtiotest plays the guest for tests: it lays out rings in
// a [SliceMemory], drives the MMIO registers and reads the used ring.
package virtio
