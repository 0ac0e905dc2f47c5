// Package bench measures how fast cowork-vmm starts a guest and what it
// costs, the way a user experiences it: it drives the real helper binary
// through its socket as the desktop client does, timestamps every phase of
// a start on the client side (helper start → socket bound, startVM → VM
// created → vCPUs running → /init (the boot timer) → agent connected,
// spawn → exit, first stdout byte, stopVM → VM gone), samples the helper's
// RSS apart from the guest RAM it touched, and boots the same kernel and
// initramfs under qemu-system-x86_64 (-M microvm; -M q35 with SeaBIOS and
// with OVMF, the official helper's firmware) interleaved with ours as the
// peers every figure is a ratio against. The report judges issue #17's
// boot-latency targets against those medians (targets.go).
//
// Then it benchmarks file sharing (fs.go): the test guest of
// testharness/guestboot runs the same workloads as that package's
// TestFSBench (sequential write and read, 4 KiB random reads, a git-status
// style tree walk, git status, python3's start) over our virtio-fs and
// virtio-9p devices and qemu microvm's virtio-9p and vhost-user-fs with
// virtiofsd, interleaved, each sharing the same directory; the report's
// "fs" section has their medians and virtio-fs's speed-up over each. The
// same runs measure the block device: the sequential write + fsync and
// read and the random reads on a raw disk image, our virtio-blk beside
// qemu's on the same file; the "blk" section has their MB/s and the ratio
// ours/qemu (--fs-runs, --fs-sizes; 0 runs leaves both out).
//
// Then it times the real Claude Code CLI (sdk.go; package sdkturn): spawn
// → first stdout byte and spawn → exit of `claude -p` (stdin closed) and
// of one stream-json turn, cold and warm, in the test guest on our VMM
// (virtio-fs), on qemu microvm + virtiofsd, and natively on this machine,
// the same binary from the same directory against a fake API on each
// system's own loopback; the report's "sdk" section has the medians, our
// guest over each other system, and issue #42's targets (--sdk-runs,
// --sdk-dir; skipped with the reason when the CLI is not fetched).
// --benches picks among the boot, fs and sdk benches.
//
// Every system is also measured in units that barely depend on the host's
// speed (work.go, workreport.go): KVM's exit counters by reason for the
// VMM's VMs, from the kernel's debugfs (the same for our VMM and qemu),
// and the CPU time of the VMM's processes (qemu and virtiofsd both
// counted), each sampled at the instants of an operation and reported
// per op: a boot to /init, an agent connect, a spawn, a MiB read or
// written, a random read, a tree walk, a git status, a python start. The
// report's work section has them with ratios ours/peer and issue #42's
// work targets; where debugfs cannot be read it says why instead of
// counting zero. WorkMeter.Sample and WorkSample.Sub are the API for any
// other operation.
//
// Run is the bench (cowork-bench, its one binary, is its command line:
// AddFlags, Validate); the report is a Markdown table on the terminal plus
// report.json and report.svg in the output directory.
// On hosts without a usable KVM it measures what it can (the process
// backend, labelled as having no peer) and says what it skipped and why.
package bench
