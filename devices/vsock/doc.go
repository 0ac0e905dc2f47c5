// Package vsock is a userspace virtio-vsock device (virtio device id 19):
// the guest's AF_VSOCK stream sockets reach host Go code as net.Listener and
// net.Conn values, with no /dev/vhost-vsock.
//
// It is split by job, after Firecracker's vsock device:
//   - packet.go: the 44-byte virtio_vsock_hdr codec and its validation;
//   - connection.go: one stream's state machine and credit-based flow control;
//   - muxer.go: routing by (host port, guest port), listeners, caps, RSTs;
//   - device.go: the virtio Device (rx, tx and event queues, config space);
//   - netconn.go, listener.go, addr.go, deadline.go: the host-side net API
//     (a Conn's net.Conn methods, the net.Listener, addresses, deadlines);
//   - ring.go: the bounded byte FIFO;
//   - state.go: the device across a VM snapshot (virtio.StateSaver): a
//     device restored from a snapshot taken with connections open sends
//     the guest VIRTIO_VSOCK_EVENT_TRANSPORT_RESET on the event queue, so
//     its kernel resets the connections whose host ends are gone.
//
// Guest-caused problems are logged through internal/ratelog, so that a
// guest cannot flood the host's log.
//
// Package vsocktest plays a Linux guest's vsock stack against the device,
// for tests here and in packages built on it.
//
// Everything the guest sends is hostile input: headers are copied out of guest
// memory once and the copy is validated; a bad packet is completed with used
// length 0 and the tx queue keeps draining; every buffer a guest or a host
// peer can grow is bounded.
package vsock
