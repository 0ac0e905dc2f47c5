// Package guestboot is the first real payload of the nested harness: it
// packs our guest kernel's test guest (a static Go /init, testinit, that
// prints on the serial console, writes the boot timer and restarts) and
// times its boot on our VMM and on qemu -M microvm in the same outer guest,
// so their ratio means something even though absolute nested figures don't.
// It also measures 9p throughput the same way: testinit, told so on the
// kernel command line (package ninep holds that contract), writes and reads
// a file over our virtio-9p device and over qemu's, both exporting the same
// directory (TestThroughput9p).
//
// Its tests run inside the nested guest (see internal/nested's
// TestNestedBootGuestKernel); elsewhere they skip.
package guestboot
