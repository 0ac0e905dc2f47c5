// Package blk is the virtio block device (virtio-blk, device id 2) of
// cowork-vmm: it serves one disk, a Backing, to the guest through package
// virtio's transport. Capacity is the backing's size in 512-byte sectors,
// fixed when the device is made.
//
// The package owns the guest-facing side of the disk: the feature bits
// and configuration space it offers, the request queue's worker, and every
// check of what the guest asks for. It does not own the storage: the
// device calls a Backing (backing.go) with ranges it has checked, and the
// caller opens, locks and closes what is behind it. Two backings exist:
//
//   - File (New, or NewFile and NewBacked): a raw disk image, a regular
//     (usually sparse) host file. Reads and writes go to the host page
//     cache with one preadv(2) or pwritev(2) straight between the file
//     and the guest's buffers (virtio.Slicer, so no copy through host
//     memory); VIRTIO_BLK_T_FLUSH is fdatasync(2); T_DISCARD punches a
//     hole (FALLOC_FL_PUNCH_HOLE); T_WRITE_ZEROES punches a hole when the
//     driver allows unmapping and zeroes the range (FALLOC_FL_ZERO_RANGE,
//     else written zeros) when it does not.
//   - cow.Disk (package blk/cow): a read-only base region of a host file
//     (a partition of the client's bundle image) under a sparse
//     per-profile copy-on-write overlay, whose cluster map a flush commits
//     after syncing the data.
//
// A driver that does not negotiate VIRTIO_BLK_F_FLUSH gets write-through
// (each write is flushed before it completes), as virtio 1.2 §5.2.6.2
// requires. Requests served: T_IN, T_OUT, T_FLUSH, T_GET_ID (the serial),
// T_DISCARD and T_WRITE_ZEROES. Anything else is VIRTIO_BLK_S_UNSUPP.
//
// The guest is hostile: a request's framing (header, data, status byte),
// direction of its buffers, length, sector range (overflow included),
// segment count and size (seg_max, size_max) and discard ranges are all
// checked before any host I/O, and a bad request is answered with
// VIRTIO_BLK_S_IOERR or VIRTIO_BLK_S_UNSUPP and logged, rate-limited; the
// device goes on with the next one. A chain without a writable byte for
// the status cannot be answered and is returned with used length 0.
//
// The device has no state of its own beyond its queue's position, which
// the transport saves for snapshots: the worker answers each request
// before it takes the next, so a quiet device has nothing in flight. What
// the backing holds is the backing's (a cow.Disk commits its map on Flush
// and Close).
package blk
