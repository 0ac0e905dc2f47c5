// Package platformreg reaches the VMM's one-byte platform registers from
// the guest's userspace: the boot timer and the snapshot point
// (protocol/guesthost, devices/platform). On x86 they are I/O ports,
// reached through /dev/port; on arm64, which has no I/O ports, each is the
// first byte of an MMIO page, mapped from /dev/mem. The agent and the test
// init use it; neither needs to know which architecture it runs on.
package platformreg
