package bench

import (
	"flag"
	"fmt"
	"slices"

	"github.com/cowork-vmm/cowork-vmm/testharness/sdkcache"
)

// Usage describes the bench, for cowork-bench's -h.
const Usage = `Times every phase of a guest start (helper start, startVM, VM created, first
guest instruction, kernel to /init, agent connected, spawn, first output,
stop), the helper's memory and the binary's size, beside qemu booting the
same kernel and initramfs (-M microvm; -M q35 with SeaBIOS and with OVMF,
the official helper's firmware), runs interleaved; then file sharing
(sequential and random I/O, a tree walk, git status, python3's start in a
test guest) over our virtio-fs and virtio-9p and qemu's virtio-9p and
virtiofsd; then the block device (sequential and random I/O on a raw disk
image) over our virtio-blk and qemu's; then the real Claude Code CLI's
turns (claude -p and a stream-json turn, spawn → first byte and → exit)
in our guest, in qemu + virtiofsd's and natively. Writes report.md,
report.json and report.svg to DIR.
`

// AddFlags registers the bench's flags on fs, each setting a field of o,
// with the defaults Run would use.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.Runs, "runs", DefaultRuns, "runs per system (interleaved)")
	fs.StringVar(&o.Out, "out", DefaultOut, "directory for report.md, report.json, report.svg")
	fs.StringVar(&o.Backend, "backend", "auto", `"kvm", "process" or "auto" (kvm when this host's KVM can boot Linux)`)
	fs.StringVar(&o.Binary, "binary", DefaultBinary, "cowork-vmm binary to measure (a static build)")
	fs.StringVar(&o.Kernel, "kernel", "", "guest vmlinux (default: $COWORK_VMM_KERNEL, then the kernel build cache)")
	fs.IntVar(&o.MemMiB, "mem", DefaultMemMiB, "guest memory in MiB")
	fs.StringVar(&o.Qemu, "qemu", "", `qemu-system-x86_64 for the peers ("none": no peers)`)
	fs.StringVar(&o.Peers, "peers", "", `peers to run, comma-separated: "microvm", "q35" (SeaBIOS), "ovmf" (q35 + OVMF) (default all)`)
	fs.DurationVar(&o.Timeout, "timeout", defaultTimeout, "bound on one boot")
	fs.IntVar(&o.FSRuns, "fs-runs", DefaultFSRuns, "runs per system of the file-sharing and block-device benchmarks (0: none)")
	fs.StringVar(&o.FSSizes, "fs-sizes", "full", `file-sharing and block-device benchmark sizes: "full" (64 MiB, 2000 random reads, 10 000 files), "ci", or mib=N,rand=N,tree=DIRSxFILES (the rest from ci)`)
	fs.StringVar(&o.FSInitrd, "fs-initrd", "", "the file-sharing test guest's initramfs (default: built with the go tool, from the source tree)")
	fs.IntVar(&o.SDKRuns, "sdk-runs", DefaultSDKRuns, "boots per system of the real Claude Code CLI's turns (0: none)")
	fs.StringVar(&o.SDKDir, "sdk-dir", "", "directory holding VERSION/claude, the pinned CLI (default: $"+sdkcache.DirEnv+", then the user's cache, where scripts/fetch-sdk.sh puts it)")
	fs.IntVar(&o.SDKMemMiB, "sdk-mem", DefaultSDKMemMiB, "the test guest's memory in MiB for the CLI's turns")
	fs.StringVar(&o.Benches, "benches", "", `benches to run, comma-separated: "boot", "fs" (file sharing and block device), "sdk" (default all)`)
}

// The benches --benches selects.
const (
	BenchBoot = "boot"
	BenchFS   = "fs"
	BenchSDK  = "sdk"
)

// selected says whether --benches leaves bench in (all are by default).
func (b *benchRun) selected(bench string) bool {
	list := splitList(b.opts.Benches)
	return len(list) == 0 || slices.Contains(list, bench)
}

// Validate checks the values AddFlags set: each error names its flag.
func (o Options) Validate() error {
	if o.Runs < 1 || o.Runs > 1000 {
		return fmt.Errorf("--runs %d: want 1 to 1000", o.Runs)
	}
	if o.FSRuns < 0 || o.FSRuns > 100 {
		return fmt.Errorf("--fs-runs %d: want 0 to 100", o.FSRuns)
	}
	if _, err := fsSizes(o); err != nil {
		return err
	}
	if o.SDKRuns < 0 || o.SDKRuns > 100 {
		return fmt.Errorf("--sdk-runs %d: want 0 to 100", o.SDKRuns)
	}
	if o.SDKMemMiB != 0 && o.SDKMemMiB < 256 {
		return fmt.Errorf("--sdk-mem %d: want at least 256 MiB (the CLI alone wants a few hundred)", o.SDKMemMiB)
	}
	for _, name := range splitList(o.Benches) {
		if name != BenchBoot && name != BenchFS && name != BenchSDK {
			return fmt.Errorf(`--benches: unknown bench %q (want "boot", "fs" or "sdk")`, name)
		}
	}
	if o.MemMiB < 64 {
		return fmt.Errorf("--mem %d: want at least 64 MiB", o.MemMiB)
	}
	switch o.Backend {
	case "auto", "kvm", "process":
	default:
		return fmt.Errorf(`--backend %q: want "kvm", "process" or "auto"`, o.Backend)
	}
	for _, p := range splitList(o.Peers) {
		if p != "microvm" && p != "q35" && p != "ovmf" {
			return fmt.Errorf(`--peers: unknown peer %q (want "microvm", "q35" or "ovmf")`, p)
		}
	}
	return nil
}

// BootSelected says whether opts run the boot bench (--benches).
func BootSelected(opts Options) bool {
	return (&benchRun{opts: opts}).selected(BenchBoot)
}

// SDKSelected says whether opts run the real CLI's turns (--benches,
// --sdk-runs).
func SDKSelected(opts Options) bool {
	return opts.SDKRuns > 0 && (&benchRun{opts: opts}).selected(BenchSDK)
}
