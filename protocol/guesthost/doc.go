// Package guesthost holds the constants the guest and the host must agree
// on, in one file (guesthost.go): the vsock ports the agent and the guest
// proxy dial, the I/O ports and magic bytes of the boot timer and the
// snapshot point, the agent's flag on the kernel command line, and the
// words of an egress refusal.
//
// It imports nothing, so both sides can use it without taking anything
// else: devices/platform (which knows nothing of the protocol's sockets),
// the guest agent, the guest proxy, the egress server, the kvm backend and
// the test guests. A value here changes on both sides at once or not at
// all: a guest built against one value and a host against another fail
// without an error (a port nobody listens on, a byte nobody checks for).
package guesthost
