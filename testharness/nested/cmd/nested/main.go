// Command nested runs a command inside the nested harness's outer guest
// (qemu TCG with nested SVM, so /dev/kvm works inside) and exits with its
// status:
//
//	go run ./testharness/nested/cmd/nested [--arch amd64|arm64] [--payload DIR] [--mem MiB] [--cpus N] [--timeout D] -- CMD ARGS...
//
// DIR is shared read-write at /payload; the host's root is visible read-only
// (amd64). With --arch arm64 the outer guest is qemu-system-aarch64's virt
// machine with a busybox root: CMD must be an arm64 program (in DIR) or a
// busybox applet.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

func main() {
	os.Exit(run())
}

func run() int {
	arch := flag.String("arch", nested.ArchAMD64, "outer guest architecture: amd64 or arm64")
	kernelPath := flag.String("kernel", "", "outer kernel (default: the built outer or outer-arm64 flavour)")
	payload := flag.String("payload", "", "host directory shared read-write at /payload (default: an empty temporary one)")
	mem := flag.Int("mem", nested.DefaultMemMiB, "outer guest memory in MiB")
	cpus := flag.Int("cpus", nested.DefaultCPUs, "outer guest vCPUs")
	timeout := flag.Duration("timeout", nested.DefaultTimeout, "payload timeout")
	dir := flag.String("dir", "", "payload working directory in the guest (default /payload)")
	appendArgs := flag.String("append", "", "extra outer kernel command line (e.g. loglevel=7)")
	gicv2 := flag.Bool("gicv2", false, "arm64: give the outer guest a GICv2, as a Raspberry Pi has")
	pages16K := flag.Bool("pages16k", false, "arm64: boot the outer kernel with 16 KiB pages (make kernel-outer-16k-arm64)")
	quiet := flag.Bool("quiet", false, "print only the payload's output, not the whole console")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] -- CMD [ARGS...]\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		return 2
	}
	if err := nested.AvailableArch(*arch); err != nil && *kernelPath == "" {
		fmt.Fprintln(os.Stderr, "nested:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := nested.Options{
		Arch: *arch, Kernel: *kernelPath, PayloadDir: *payload, Cmd: flag.Args(), MemMiB: *mem, CPUs: *cpus,
		Timeout: *timeout, Dir: *dir, Append: *appendArgs, GICv2: *gicv2, Pages16K: *pages16K,
	}
	if !*quiet {
		opts.Stdout = os.Stdout
	}
	res, err := nested.Run(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nested:", err)
		return 1
	}
	if *quiet {
		fmt.Print(res.Output)
	}
	fmt.Fprintf(os.Stderr, "nested: exit %d, wall %v, outer /init after %v wall (%v guest uptime), %s\n",
		res.ExitCode, res.Wall.Round(time.Millisecond), res.InitWall.Round(time.Millisecond), res.InitUptime, res.ClockNote())
	return res.ExitCode
}
