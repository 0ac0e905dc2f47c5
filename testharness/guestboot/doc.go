// Package guestboot is the first real payload of the nested harness: it
// packs our guest kernel's test guest (a static Go /init, testinit, that
// prints on the serial console, writes the boot timer and restarts) and
// times its boot on our VMM and on qemu -M microvm in the same outer guest,
// so their ratio means something even though absolute nested figures don't.
// On arm64 (TestBootARM64Bench, which testharness/nested's
// TestNestedARM64BootGuestKernel runs in the arm64 harness) the peer is
// qemu -M virt -accel kvm (QemuVirt), the same Image and initramfs booted
// in alternation, and each run also counts its VMM's KVM exits and CPU
// time up to the ready line (package bench's WorkMeter).
// It also benchmarks file sharing the same way (package fsrun's FSBench;
// fs.go has the sizes, the figure lines and their summaries): testinit,
// told so on the kernel command line (package fsbench holds that
// contract), writes and reads a file, makes random reads, walks a tree,
// runs git status and starts python3 over our virtio-fs and virtio-9p
// devices and over qemu's virtio-9p and vhost-user-fs with virtiofsd, all
// sharing the same directory and the same host root (fsrun's TestFSBench;
// package bench reports the same runs in `make bench`). In its SDK mode
// (package sdkturn) testinit runs the real Claude Code CLI, from the
// shared directory, chrooted in the shared host root, against a fake API
// on its own loopback (fsrun's Boot boots it; package bench times it).
//
// Its tests run inside the nested guest (see testharness/nested's
// TestNestedBootGuestKernel); elsewhere they skip.
package guestboot
