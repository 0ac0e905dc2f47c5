// Package p9 is the virtio-9p device (virtio id 9): one request queue whose
// chains each carry one 9P2000.L T-message (in the readable buffers) and
// receive its R-message (in the writable buffers), served by a
// github.com/hugelgupf/p9 server over the exports of package hostfs. The
// server's p9.File is a thin adapter over a hostfs.Node (node.go:
// ExportsAttacher), which converts arguments, QIDs, attributes and
// errnos and nothing more.
//
// The guest is hostile. Every message is copied out of guest memory once
// and checked before the server sees it: its size against its buffers and
// the negotiated msize, its body against the layout the server will decode
// (msg.go). The one exception is a large Twrite's data, opaque bytes whose
// length is checked: the server reads it straight from the chain (no copy
// of the device's own; see bridge.go). A bad message is answered with Rlerror (EINVAL, EMSGSIZE,
// EOPNOTSUPP), a chain too small to answer completes with length 0, and the
// device keeps serving. Requests run concurrently, at most MaxInFlight at
// once, each under a tag of the device's own (bridge.go); fids are bounded
// by MaxFids, the host descriptors behind them by the export layer's
// budget (package hostfs: ENFILE past it), and the msize a guest may negotiate by MaxMessageSize, so a
// guest holds at most MaxInFlight × MaxMessageSize bytes of host memory;
// Treaddir's count is lowered to what an Rreaddir within the negotiated
// msize carries (the server would build a reply of any count).
//
// The server's failures do not hang the guest (guard.go, bridge.go): a
// panic in a file operation is answered with Rlerror EIO, logged
// (rate-limited), and serving goes on; when the server connection itself
// dies, every request in flight or queued is answered with EIO, the device
// sets DEVICE_NEEDS_RESET, and the next activation gets a new server.
//
// Answered by the device itself, because hugelgupf/p9 answers them wrongly
// for the Linux client: Txattrwalk (ENODATA for a name, EOPNOTSUPP for the
// list), Txattrcreate (EOPNOTSUPP) and Tgetlock (no conflicting lock: the
// guest kernel already arbitrates locks among guest processes; Tlock
// succeeds in package hostfs for the same reason).
//
// Linux gives each virtio-9p device to one mount at a time (a second mount
// of the same tag fails with EBUSY), so one device serves every export by
// mounting the attach root once (aname "") and bind-mounting
// <root>/<export name> where each export belongs; or mounting one export
// by aname when only one is needed.
package p9
