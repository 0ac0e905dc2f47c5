// Package nested runs a payload inside a Linux guest that has a real
// /dev/kvm, on machines whose own KVM cannot boot Linux: qemu's emulator
// (TCG) with nested AMD SVM boots the "outer" kernel (guest/kernel, flavour
// outer) with a static Go /init (outerinit) that shares the host's root
// read-only over virtio-9p, runs the payload command and reports its output
// and exit status on the serial console. The README's "Development" section
// (make nested, make nested-stress) and docs/ARCHITECTURE.md ("Tests and
// tools around it") say when the harness is used; qemuArgs in nested.go is
// the outer guest's command line. Its CPU is x86-64-v2 (outerCPU: real
// programs need SSE4.2 and POPCNT) and it keeps time with the TSC, told
// the host's rate (tsc.go); outerinit reports the clocksource before and
// after the payload and Result.CoarseClock flags a run timed on jiffies.
//
// Run is the API; RunGoTest runs another package's tests inside; the CLI is
// cmd/nested (make nested PAYLOAD=dir CMD='...'). An outer guest that
// freezes (qemu's TCG with nested SVM sometimes stops for good) is found by
// qemu's CPU time standing still and ends its run with ErrOuterFroze, which
// RunThroughFreezes (TryGoTest's and cowork-bench's) runs again (freeze.go).
//
// Options.Arch (GoTest.Arch) "arm64" selects the arm64 harness (arch.go):
// qemu-system-aarch64 -M virt,virtualization=on,gic-version=3 -cpu max
// (with qemu's cheap pointer authentication, 3x faster under TCG) boots
// the "outer-arm64" kernel flavour's Image at EL2, so its KVM runs in VHE
// mode with a real /dev/kvm; outerinit and the test binaries are
// cross-built with GOARCH=arm64. The host's x86 root is of no use there:
// the harness shares the arm64 Debian root that scripts/arm64-userland.sh
// caches (busybox-static, curl, ca-certificates, qemu-system-arm and their
// dependencies, about 150 MB: too big for the initramfs) read-only over
// virtio-9p, outerinit lays a tmpfs overlay over it and links busybox's
// applets where no package provides the name; with debugfs, /payload
// and the shares (the module, for testdata), all over virtio-9p on
// virtio-mmio.
// AvailableArch says what is missing; RequireARM64Harness gates a wrapper;
// its boots enter the ledger as "nested-arm64". The outer clock there is
// the architected counter (arch_sys_counter), reported as on x86.
package nested
