// Package guestboot is the first real payload of the nested harness: it
// packs our guest kernel's test guest (a static Go /init, testinit, that
// prints on the serial console, writes the boot timer and restarts) and
// times its boot on our VMM and on qemu -M microvm in the same outer guest,
// so their ratio means something even though absolute nested figures don't.
//
// Its tests run inside the nested guest (see internal/nested's
// TestNestedBootGuestKernel); elsewhere they skip.
package guestboot
