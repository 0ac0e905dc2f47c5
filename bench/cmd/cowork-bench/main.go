// Command cowork-bench is the benchmark binary (`make bench` runs it): it
// runs the cowork-vmm boot, file-sharing and block-device benchmarks
// (package bench) against a cowork-vmm binary, directly on a host whose
// KVM can boot Linux, and otherwise inside the nested harness
// (testharness/nested: qemu's emulator with nested SVM gives the outer
// guest a real /dev/kvm; the host's root, qemu included, is shared into it
// read-only), then copies the reports to --out. The file-sharing test
// guest's initramfs (testharness/guestboot's testinit) is built here,
// outside the harness.
//
//	cowork-bench --binary bin/cowork-vmm [--runs N] [--fs-runs N] [--out DIR] [--kernel vmlinux]
//	cowork-bench --direct …   (what runs inside the harness)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/bench"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cowork-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts bench.Options
	opts.AddFlags(fs)
	direct := fs.Bool("direct", false, "run here even without a KVM that boots Linux (the process backend then)")
	outerCPUs := fs.Int("nested-cpus", 1, "vCPUs of the nested harness's outer guest")
	timeout := fs.Duration("nested-timeout", 0, "bound on the whole nested run (default: 4 min per run, at least 10 min)")
	console := fs.Bool("console", false, "show the nested harness's serial console (the bench's progress inside) on stderr")
	fs.BoolVar(&opts.InHarness, "in-nested-harness", false, "set by this program on its run inside the nested harness: q35 + OVMF only when --peers names it")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: cowork-bench [--binary bin/cowork-vmm] [--runs N] [--out DIR] [flags]\n\n"+bench.Usage+
			"\nWhere this host's KVM cannot boot Linux, it runs itself inside the nested harness (--direct: here, on the process backend).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cowork-bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintln(stderr, "cowork-bench:", err)
		return 2
	}
	ok, why := bench.HostCanBootVMs()
	if ok || *direct {
		return runHere(ctx, opts, stdout, stderr)
	}
	fmt.Fprintf(stderr, "cowork-bench: %s; running the bench inside the nested harness (qemu TCG with nested SVM: a real /dev/kvm; figures count only as ratios)\n", why)
	var live io.Writer
	if *console {
		live = stderr
	}
	if err := runNested(ctx, opts, *outerCPUs, *timeout, live, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "cowork-bench:", err)
		return 1
	}
	fmt.Fprintf(stderr, "cowork-bench: results in %s (report.md, report.json, report.svg)\n", opts.Out)
	return 0
}

// runHere runs the bench on this host and prints the report; 1 when it
// failed or measured none of our runs.
func runHere(ctx context.Context, opts bench.Options, stdout, stderr io.Writer) int {
	rep, err := bench.Run(ctx, opts, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "cowork-bench:", err)
		return 1
	}
	if err := bench.PrintReport(stdout, filepath.Join(opts.Out, "report.json")); err != nil {
		fmt.Fprintln(stderr, "cowork-bench:", err)
		return 1
	}
	fmt.Fprintf(stderr, "cowork-bench: results in %s (report.md, report.json, report.svg)\n", opts.Out)
	if !bench.BootSelected(opts) {
		return 0
	}
	for _, s := range rep.Systems {
		if !s.Peer && len(s.Phases) == 0 {
			return 1
		}
	}
	return 0
}

// runNested runs this program with --direct inside the harness, with the
// binary and the kernel in the payload, and copies the reports out.
func runNested(ctx context.Context, opts bench.Options, cpus int, timeout time.Duration, console, stdout, stderr io.Writer) error {
	if err := nested.Available(); err != nil {
		return fmt.Errorf("cannot measure the VMM on this host: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	vmlinux := opts.Kernel
	if vmlinux == "" {
		if vmlinux, err = kernel.Find(kernel.Guest); err != nil {
			return err
		}
	}
	files := map[string]string{"cowork-bench": self, "cowork-vmm": opts.Binary, "kernel/vmlinux": vmlinux}
	if bz := bench.BzImageBeside(vmlinux); bz != "" {
		files["kernel/bzImage"] = bz
	}
	payload, err := os.MkdirTemp("", "cowork-bench-payload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(payload)
	if timeout <= 0 {
		// A file-sharing run of the four systems takes minutes nested; a run
		// of the SDK turns (two guests and native, four turns each) took
		// 15 to 20 minutes on a loaded machine.
		timeout = max(10*time.Minute, time.Duration(opts.Runs)*4*time.Minute+time.Duration(opts.FSRuns)*40*time.Minute+time.Duration(opts.SDKRuns)*45*time.Minute)
	}
	cmd := []string{"/payload/cowork-bench", "--direct", "--binary", "/payload/cowork-vmm",
		"--kernel", "/payload/kernel/vmlinux", "--runs", strconv.Itoa(opts.Runs),
		"--mem", strconv.Itoa(opts.MemMiB), "--out", "/payload/out",
		"--fs-runs", strconv.Itoa(opts.FSRuns), "--fs-sizes", opts.FSSizes, "--in-nested-harness"}
	if opts.FSRuns > 0 || opts.SDKRuns > 0 {
		// The test guest's /init is built here: the outer guest has the go
		// tool but no build cache, and compiling under the emulator is slow.
		initrd := opts.FSInitrd
		if initrd == "" {
			initrd = filepath.Join(payload, "fs-initrd.cpio.gz")
			if err := guestboot.BuildInitramfs(ctx, initrd); err != nil {
				return fmt.Errorf("the file-sharing and SDK test guest (give --fs-runs 0 --sdk-runs 0 to skip it): %w", err)
			}
		} else {
			files["fs-initrd.cpio.gz"] = initrd
		}
		cmd = append(cmd, "--fs-initrd", "/payload/fs-initrd.cpio.gz")
	}
	if opts.Peers != "" {
		cmd = append(cmd, "--peers", opts.Peers)
	}
	if opts.Benches != "" {
		cmd = append(cmd, "--benches", opts.Benches)
	}
	outerMiB := max(nested.DefaultMemMiB, 2*opts.MemMiB+512)
	sdkArgs, shares, sdkMiB := sdkInHarness(opts)
	cmd = append(cmd, sdkArgs...)
	res, err := nested.RunThroughFreezes(ctx, nested.Options{
		PayloadDir: payload, Files: files, Cmd: cmd, CPUs: cpus, Shares: shares,
		MemMiB: outerMiB + sdkMiB, Timeout: timeout, Stdout: console,
	}, func(retry, of int, froze error) {
		fmt.Fprintf(stderr, "cowork-bench: nested harness: %v; running the bench again (%d of %d)\n", strings.SplitN(froze.Error(), "\n", 2)[0], retry, of)
	})
	if err != nil {
		return fmt.Errorf("nested harness: %w", err)
	}
	fmt.Fprintf(stderr, "cowork-bench: nested run: wall %v, outer /init at %v, %s\n", res.Wall.Round(time.Millisecond), res.InitUptime, res.ClockNote())
	if res.ExitCode != 0 {
		return fmt.Errorf("the bench inside the harness failed (exit %d):\n%s", res.ExitCode, res.Output)
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"report.md", "report.json", "report.svg"} {
		b, err := os.ReadFile(filepath.Join(payload, "out", name))
		if err != nil {
			return fmt.Errorf("the bench inside the harness wrote no %s: %w\n%s", name, err, res.Output)
		}
		if err := os.WriteFile(filepath.Join(opts.Out, name), b, 0o644); err != nil {
			return err
		}
	}
	return bench.PrintReport(stdout, filepath.Join(opts.Out, "report.json"))
}
