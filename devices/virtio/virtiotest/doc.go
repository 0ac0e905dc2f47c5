// Package virtiotest plays the guest's virtio driver in tests: it lays out
// descriptor tables, available and used rings and buffers in a
// virtio.SliceMemory, drives a device through the virtio-mmio registers
// (reset, feature negotiation, queue set-up, DRIVER_OK), adds descriptor
// chains (readable and writable buffers, optionally through an indirect
// table), kicks, and collects used buffers with waits that time out rather
// than hang. Low-level methods write raw descriptors and ring indices so
// tests can play a hostile guest too.
//
// Typical use, in a device's tests:
//
//	d := virtiotest.Start(t, dev, virtiotest.Options{})
//	q := d.Queue(0)
//	head, err := q.Add(virtiotest.Readable(request), virtiotest.Writable(4096))
//	q.Kick()
//	used, err := q.Wait(5 * time.Second)
//	// used.Head == head; used.Data holds the first used.Len bytes the
//	// device wrote into the writable buffers.
package virtiotest
