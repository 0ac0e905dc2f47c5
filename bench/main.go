package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// Defaults of the flags.
const (
	DefaultRuns    = 5
	DefaultOut     = "bench-results"
	DefaultMemMiB  = 512
	defaultTimeout = 3 * time.Minute
)

// Options are the bench's settings (the flags of `cowork-vmm bench`).
type Options struct {
	Runs    int
	Out     string
	Backend string // "auto", "kvm" or "process"
	Binary  string // the cowork-vmm binary to drive; default this executable
	Kernel  string // guest vmlinux; default $COWORK_VMM_KERNEL, then the build cache
	MemMiB  int
	Qemu    string // qemu-system-x86_64 path; "none" disables the peers
	Peers   string // comma-separated subset of "microvm,q35"; empty: all
	Timeout time.Duration
}

// Main is `cowork-vmm bench [flags]`: args are the arguments after
// "bench"; the tables go to stdout, progress and notes to stderr. It
// returns the exit status: 0 when our runs succeeded, 1 when none did, 2
// for bad flags.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "cowork-vmm bench:", err)
		return 2
	}
	rep, err := Run(ctx, opts, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "cowork-vmm bench:", err)
		return 1
	}
	if err := WriteMarkdown(stdout, rep); err != nil {
		fmt.Fprintln(stderr, "cowork-vmm bench:", err)
		return 1
	}
	fmt.Fprintf(stderr, "cowork-vmm bench: results in %s (report.md, report.json, report.svg)\n", opts.Out)
	for _, s := range rep.Systems {
		if !s.Peer && len(s.Phases) == 0 {
			return 1
		}
	}
	return 0
}

// stage copies the helper binary and the kernel (with the bzImage beside
// it, if any) into dir and returns the copies' paths.
func stage(dir, binary, vmlinux string) (string, string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	copies := [][2]string{{binary, "cowork-vmm"}, {vmlinux, "vmlinux"}}
	if bz := BzImageBeside(vmlinux); bz != "" {
		copies = append(copies, [2]string{bz, "bzImage"})
	}
	for _, c := range copies {
		if err := copyFile(filepath.Join(dir, c[1]), c[0]); err != nil {
			return "", "", fmt.Errorf("staging %s for the bench: %w", c[0], err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "cowork-vmm"), 0o755); err != nil {
		return "", "", err
	}
	return filepath.Join(dir, "cowork-vmm"), filepath.Join(dir, "vmlinux"), nil
}

func parseFlags(args []string, stderr io.Writer) (Options, error) {
	o := Options{}
	fs := flag.NewFlagSet("cowork-vmm bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Runs, "runs", DefaultRuns, "runs per system (interleaved)")
	fs.StringVar(&o.Out, "out", DefaultOut, "directory for report.md, report.json, report.svg")
	fs.StringVar(&o.Backend, "backend", "auto", `"kvm", "process" or "auto" (kvm when this host's KVM can boot Linux)`)
	fs.StringVar(&o.Binary, "binary", "", "cowork-vmm binary to measure (default: this one)")
	fs.StringVar(&o.Kernel, "kernel", "", "guest vmlinux (default: $COWORK_VMM_KERNEL, then the kernel build cache)")
	fs.IntVar(&o.MemMiB, "mem", DefaultMemMiB, "guest memory in MiB")
	fs.StringVar(&o.Qemu, "qemu", "", `qemu-system-x86_64 for the peers ("none": no peers)`)
	fs.StringVar(&o.Peers, "peers", "", `peers to run: "microvm", "q35" or both, comma-separated (default both)`)
	fs.DurationVar(&o.Timeout, "timeout", defaultTimeout, "bound on one boot")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: cowork-vmm bench [--runs N] [--out DIR] [flags]

Times every phase of a guest start (helper start, startVM, VM created, first
guest instruction, kernel to /init, agent connected, spawn, first output,
stop), the helper's memory and the binary's size, beside qemu booting the
same kernel and initramfs (-M microvm, -M q35), runs interleaved. Writes
report.md, report.json and report.svg to DIR.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.Runs < 1 || o.Runs > 1000 {
		return o, fmt.Errorf("--runs %d: want 1 to 1000", o.Runs)
	}
	if o.MemMiB < 64 {
		return o, fmt.Errorf("--mem %d: want at least 64 MiB", o.MemMiB)
	}
	switch o.Backend {
	case "auto", "kvm", "process":
	default:
		return o, fmt.Errorf(`--backend %q: want "kvm", "process" or "auto"`, o.Backend)
	}
	for _, p := range splitList(o.Peers) {
		if p != "microvm" && p != "q35" {
			return o, fmt.Errorf(`--peers: unknown peer %q (want "microvm" and/or "q35")`, p)
		}
	}
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// hostKVM says whether this host's KVM can boot a Linux guest (the probe
// doctor and the kvm backend use): "real", or why not ("none", "pvm",
// "unusable").
func hostKVM() (state, reason string) {
	p := kvm.ProbeHost(kvm.DevicePath)
	err := p.BootsLinux()
	switch {
	case err == nil:
		return "real", ""
	case errors.Is(p.OpenErr, kvm.ErrNoKVM):
		return "none", err.Error()
	case p.PVM:
		return "pvm", err.Error()
	}
	return "unusable", err.Error()
}

// nestedHost reports whether this machine is itself a guest (the CPU's
// hypervisor flag): figures are then only meaningful as ratios.
func nestedHost() bool {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "flags") {
			return strings.Contains(" "+line+" ", " hypervisor ")
		}
	}
	return false
}

func hostInfo(kvmState string) Host {
	h := Host{CPUs: runtime.NumCPU(), KVM: kvmState, Nested: nestedHost(), Go: runtime.Version()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = "Linux " + unix.ByteSliceToString(u.Release[:])
	}
	return h
}

// Run measures and writes the report files to opts.Out; progress and
// notes go to progress (a \r-updated line).
func Run(ctx context.Context, opts Options, progress io.Writer) (Report, error) {
	if opts.Runs <= 0 {
		opts.Runs = DefaultRuns
	}
	if opts.MemMiB <= 0 {
		opts.MemMiB = DefaultMemMiB
	}
	if opts.Timeout <= 0 {
		opts.Timeout = defaultTimeout
	}
	if opts.Out == "" {
		opts.Out = DefaultOut
	}
	if opts.Backend == "" {
		opts.Backend = "auto"
	}
	binary, err := resolveBinary(opts.Binary)
	if err != nil {
		return Report{}, err
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return Report{}, fmt.Errorf("creating --out %s: %w", opts.Out, err)
	}
	work, err := os.MkdirTemp("", "cowork-bench-")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(work)

	kvmState, kvmWhy := hostKVM()
	show := newProgress(progress)
	defer show.clear()
	var notes []string
	note := func(s string) {
		notes = append(notes, s)
		show.line("%s", s)
	}
	backend := opts.Backend
	if backend == "auto" {
		backend = "kvm"
		if kvmState != "real" {
			backend = "process"
			note("the kvm backend (our VMM) is not measured: " + kvmWhy + "; measuring the process backend alone (no VM, no peer). " +
				"On a machine like this, `make bench` measures the VMM inside the nested harness (qemu with nested SVM gives a real /dev/kvm).")
		}
	}

	results := NewResults()
	label := "cowork-vmm (" + backend + " backend)"
	results.AddSystem(SystemOurs, label, false)

	var peers []qemuPeer
	var vmlinux, initrd, qemu, bzImage string
	if backend == "kvm" {
		vmlinux, err = resolveKernel(opts.Kernel)
		if err != nil {
			return Report{}, err
		}
		// Every system reads the same local copies: the originals may sit on
		// a slower file system (the harness's 9p payload), and a helper
		// reads its own executable for the initramfs on every start.
		if binary, vmlinux, err = stage(filepath.Join(work, "stage"), binary, vmlinux); err != nil {
			return Report{}, err
		}
		var why string
		if qemu, why = findQemu(opts.Qemu, kvmState, kvmWhy); why != "" {
			note("no qemu peer: " + why)
		}
	} else {
		note("no qemu peer: the process backend boots no kernel, so there is nothing to compare it with")
	}
	if qemu != "" {
		initrd = filepath.Join(work, "initramfs.cpio")
		if err := writeInitramfs(initrd, binary); err != nil {
			return Report{}, err
		}
		bzImage = BzImageBeside(vmlinux)
		only := map[string]bool{}
		for _, p := range splitList(opts.Peers) {
			only[p] = true
		}
		var peerNotes []string
		peers, peerNotes = qemuPeers(vmlinux, bzImage, only)
		for _, n := range peerNotes {
			note(n)
		}
		for _, p := range peers {
			results.AddSystem(p.ID, p.Label, true)
		}
	}

	for run := 1; run <= opts.Runs; run++ {
		status := func(system, step string) {
			show.status("run %d/%d %s: %s", run, opts.Runs, system, step)
		}
		h := helperRun{
			Binary: binary, Backend: backend, MemMiB: opts.MemMiB, Timeout: opts.Timeout,
			Dir:      filepath.Join(work, fmt.Sprintf("ours-%d", run)),
			Progress: func(step string) { status(SystemOurs, step) },
		}
		if backend == "kvm" {
			h.Kernel = vmlinux
		}
		res, err := h.run(ctx)
		// A failed run still reports the phases it completed.
		results.AddRun(SystemOurs, res.Phases, res.Memory)
		if err != nil {
			results.AddFailure(SystemOurs, firstLine(err.Error()))
			show.line("run %d %s failed: %v", run, SystemOurs, err)
		}
		if ctx.Err() != nil {
			return Report{}, ctx.Err()
		}
		for i := 0; i < len(peers); i++ {
			p := peers[i]
			status(p.ID, "booting to /init")
			dir := filepath.Join(work, fmt.Sprintf("%s-%d", p.ID, run))
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return Report{}, err
			}
			args, err := p.args(dir)
			if err == nil {
				var res runResult
				res, err = qemuBoot{Qemu: qemu, Args: args, Initrd: initrd, MemMiB: opts.MemMiB, Dir: dir, Timeout: opts.Timeout}.run(ctx)
				if err == nil {
					results.AddRun(p.ID, res.Phases, res.Memory)
					continue
				}
			}
			if ctx.Err() != nil {
				return Report{}, ctx.Err()
			}
			results.AddFailure(p.ID, firstLine(err.Error()))
			show.line("run %d %s failed: %v", run, p.ID, err)
			if p.Label == "qemu q35 + OVMF" && run == 1 {
				// OVMF loads only EFI-stub kernels; keep q35 with SeaBIOS.
				image := bzImage
				if image == "" {
					image = vmlinux
				}
				note("q35 with OVMF could not boot the kernel (is CONFIG_EFI_STUB set?); q35 runs with SeaBIOS instead")
				peers[i] = seabiosQ35(image)
				results.Rename(p.ID, peers[i].Label)
				i-- // retry this run with SeaBIOS
			}
		}
	}
	show.clear()

	meta := Report{Date: time.Now().UTC().Truncate(time.Second), Host: hostInfo(kvmState), Runs: opts.Runs, Backend: backend, Notes: notes}
	if info, err := os.Stat(binary); err == nil {
		meta.BinaryBytes = info.Size()
	}
	rep := results.Report(meta)
	if err := writeReports(opts.Out, rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// findQemu returns the qemu binary for the peers, or why there is none.
func findQemu(flagValue, kvmState, kvmWhy string) (path, why string) {
	if flagValue == "none" {
		return "", "disabled with --qemu none"
	}
	if kvmState != "real" {
		return "", "qemu needs a KVM that can boot Linux: " + kvmWhy
	}
	if flagValue != "" {
		if !isFile(flagValue) {
			return "", "--qemu " + flagValue + " is not a file"
		}
		return flagValue, ""
	}
	path, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
	}
	return path, ""
}

func resolveBinary(b string) (string, error) {
	if b == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("finding this executable (give --binary): %w", err)
		}
		b = exe
	}
	abs, err := filepath.Abs(b)
	if err != nil {
		return "", err
	}
	if !isFile(abs) {
		return "", fmt.Errorf("--binary %s: not a file", b)
	}
	return abs, nil
}

// resolveKernel finds the guest vmlinux both our VMM and qemu boot.
func resolveKernel(k string) (string, error) {
	if k == "" {
		k = os.Getenv("COWORK_VMM_KERNEL")
	}
	if k == "" {
		var err error
		if k, err = kernel.Find(kernel.Guest); err != nil {
			return "", fmt.Errorf("no guest kernel to boot (give --kernel): %w", err)
		}
	}
	abs, err := filepath.Abs(k)
	if err != nil {
		return "", err
	}
	if !isFile(abs) {
		return "", fmt.Errorf("guest kernel %s: not a file", k)
	}
	return abs, nil
}

// writeReports writes report.md, report.json and report.svg into dir.
func writeReports(dir string, rep Report) error {
	for name, write := range map[string]func(io.Writer, Report) error{
		"report.md": WriteMarkdown, "report.json": WriteJSON, "report.svg": WriteSVG,
	} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("writing the report: %w", err)
		}
		err = write(f, rep)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// firstLine is an error's first line, for the report (the whole error,
// with the log tail, goes to the progress output).
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
