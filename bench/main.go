package bench

import (
	"context"
	"errors"
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
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// Defaults of the flags.
const (
	DefaultRuns    = 5
	DefaultOut     = "build/bench"
	DefaultBinary  = "bin/cowork-vmm" // where make build puts it
	DefaultMemMiB  = 512
	defaultTimeout = 3 * time.Minute
)

// Options are the bench's settings (cowork-bench's flags, AddFlags).
type Options struct {
	Runs    int
	Out     string
	Backend string // "auto", "kvm" or "process"
	Binary  string // the cowork-vmm binary to drive
	Kernel  string // guest vmlinux; default $COWORK_VMM_KERNEL, then the build cache
	MemMiB  int
	Qemu    string // qemu-system-x86_64 path; "none" disables the peers
	Peers   string // comma-separated subset of "microvm,q35,ovmf"; empty: all
	Timeout time.Duration
	// FSRuns is the file-sharing benchmark's runs per system (0: none),
	// FSSizes its sizes ("full" or "ci"), FSInitrd the test guest's
	// initramfs (default: built with the go tool from the source tree).
	FSRuns   int
	FSSizes  string
	FSInitrd string
	// SDKRuns is the boots per system of the real CLI's turns (0: none,
	// sdk.go), SDKDir the directory holding VERSION/claude (default:
	// sdkcache's), SDKMemMiB the test guest's memory for them.
	SDKRuns   int
	SDKDir    string
	SDKMemMiB int
	// Benches selects the benches to run (comma-separated BenchBoot,
	// BenchFS, BenchSDK); empty: all.
	Benches string
	// InHarness says the bench runs inside the nested test harness
	// (cowork-bench sets it): the peers its emulator cannot run are left
	// out unless Peers names them (see qemuPeers).
	InHarness bool
}

// DefaultFSRuns is the file-sharing benchmark's default runs per system.
const DefaultFSRuns = 3

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
	if b, err := os.ReadFile(job.ClocksourcePath); err == nil {
		h.Clocksource = strings.TrimSpace(string(b))
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = "Linux " + unix.ByteSliceToString(u.Release[:])
	}
	return h
}

// Run measures and writes the report files to opts.Out; progress and
// notes go to progress (a \r-updated line).
func Run(ctx context.Context, opts Options, progress io.Writer) (Report, error) {
	opts = opts.withDefaults()
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

	b := &benchRun{opts: opts, work: work, binary: binary, show: newProgress(progress), results: NewResults(), accounts: NewWorkResults()}
	defer b.show.clear()
	b.kvmState, b.kvmWhy = hostKVM()
	b.chooseBackend()
	b.results.AddSystem(SystemOurs, "cowork-vmm ("+b.backend+" backend)", false)
	if b.backend == "kvm" {
		b.results.AddSystem(SystemOursWarm, "cowork-vmm, warm start (restored from its snapshot)", false)
	}
	if err := b.prepareSystems(); err != nil {
		return Report{}, err
	}
	b.prepareWork()
	for run := 1; run <= opts.Runs && b.selected(BenchBoot); run++ {
		if err := b.measure(ctx, run); err != nil {
			return Report{}, err
		}
	}
	if b.selected(BenchFS) {
		if err := b.measureFS(ctx); err != nil {
			return Report{}, err
		}
	}
	if err := b.measureSDK(ctx); err != nil {
		return Report{}, err
	}
	b.show.clear()
	return b.writeReport()
}

// withDefaults fills in the options left at their zero value.
func (o Options) withDefaults() Options {
	if o.Runs <= 0 {
		o.Runs = DefaultRuns
	}
	if o.MemMiB <= 0 {
		o.MemMiB = DefaultMemMiB
	}
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.Out == "" {
		o.Out = DefaultOut
	}
	if o.Backend == "" {
		o.Backend = "auto"
	}
	if o.SDKMemMiB <= 0 {
		o.SDKMemMiB = DefaultSDKMemMiB
	}
	return o
}

// benchRun is the state of one Run: what it measures with, and what it
// has measured and noted so far.
type benchRun struct {
	opts             Options
	work             string // temporary directory, removed by Run
	show             *progress
	notes            []string
	results          *Results
	kvmState, kvmWhy string // hostKVM
	backend          string // "kvm" or "process"

	// What the systems run: our binary, the guest kernel and, for the qemu
	// peers, the initramfs and the bzImage beside the kernel.
	binary, vmlinux, initrd, qemu, bzImage string
	peers                                  []qemuPeer

	// fs: the file-sharing runs (nil when not run).
	fs *fsResults
	// sdk: the real CLI's turns (nil when not run).
	sdk *sdkResults
	// meter samples the VMMs' work (nil: not measured, on the process
	// backend); accounts is what it measured.
	meter    *WorkMeter
	accounts *WorkResults
}

// note records a note for the report and shows it.
func (b *benchRun) note(s string) {
	b.notes = append(b.notes, s)
	b.show.line("%s", s)
}

// chooseBackend resolves "auto": kvm where this host's KVM boots Linux,
// else the process backend (with a note saying why).
func (b *benchRun) chooseBackend() {
	b.backend = b.opts.Backend
	if b.backend != "auto" {
		return
	}
	b.backend = "kvm"
	if b.kvmState != "real" {
		b.backend = "process"
		b.note("the kvm backend (our VMM) is not measured: " + b.kvmWhy + "; measuring the process backend alone (no VM, no peer). " +
			"On a machine like this, `make bench` measures the VMM inside the nested harness (qemu with nested SVM gives a real /dev/kvm).")
	}
}

// prepareSystems stages the binary and the kernel for the kvm backend and
// sets up the qemu peers that can run here, noting why any cannot.
func (b *benchRun) prepareSystems() error {
	if b.backend != "kvm" {
		b.note("no qemu peer: the process backend boots no kernel, so there is nothing to compare it with")
		return nil
	}
	vmlinux, err := resolveKernel(b.opts.Kernel)
	if err != nil {
		return err
	}
	// Every system reads the same local copies: the originals may sit on
	// a slower file system (the harness's 9p payload), and a helper
	// reads its own executable for the initramfs on every start.
	if b.binary, b.vmlinux, err = stage(filepath.Join(b.work, "stage"), b.binary, vmlinux); err != nil {
		return err
	}
	var why string
	if b.qemu, why = findQemu(b.opts.Qemu, b.kvmState, b.kvmWhy); why != "" {
		b.note("no qemu peer: " + why)
	}
	if b.qemu == "" || !b.selected(BenchBoot) { // the peers boot for the boot bench only
		return nil
	}
	b.initrd = filepath.Join(b.work, "initramfs.cpio")
	if err := writeInitramfs(b.initrd, b.binary); err != nil {
		return err
	}
	b.bzImage = BzImageBeside(b.vmlinux)
	only := map[string]bool{}
	for _, p := range splitList(b.opts.Peers) {
		only[p] = true
	}
	var peerNotes []string
	b.peers, peerNotes = qemuPeers(b.vmlinux, b.bzImage, only, b.opts.InHarness)
	for _, n := range peerNotes {
		b.note(n)
	}
	for _, p := range b.peers {
		b.results.AddSystem(p.ID, p.Label, true)
	}
	return nil
}

// status shows what run is doing on system.
func (b *benchRun) status(run int, system, step string) {
	b.show.status("run %d/%d %s: %s", run, b.opts.Runs, system, step)
}

// measure does run number run: ours, then each peer. A failed system is
// recorded as a failure; only the end of ctx (or a work directory that
// cannot be made) ends the bench.
func (b *benchRun) measure(ctx context.Context, run int) error {
	b.measureOurs(ctx, run, SystemOurs)
	if b.backend == "kvm" {
		b.measureOurs(ctx, run, SystemOursWarm)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for _, p := range b.peers {
		if err := b.measurePeer(ctx, run, p); err != nil {
			return err
		}
	}
	return nil
}

// measureOurs runs our helper once as system (SystemOurs: warm starts
// off, every start cold; SystemOursWarm: restored from the snapshot a
// first, unmeasured start took); a failed run still reports the phases it
// completed.
func (b *benchRun) measureOurs(ctx context.Context, run int, system string) {
	h := helperRun{
		Binary: b.binary, Backend: b.backend, MemMiB: b.opts.MemMiB, Timeout: b.opts.Timeout,
		Dir:      filepath.Join(b.work, fmt.Sprintf("%s-%d", system, run)),
		DataDir:  filepath.Join(b.work, system+"-data"),
		Progress: func(step string) { b.status(run, system, step) },
		Meter:    b.meter,
	}
	if b.backend == "kvm" {
		h.Kernel = b.vmlinux
	}
	if system == SystemOursWarm {
		h.SnapshotCache = filepath.Join(b.work, "snapshot-cache")
		if run == 1 {
			prime := h
			prime.Dir += "-cold"
			if _, err := prime.run(ctx); err != nil {
				b.show.line("%s: the cold start that takes the snapshot failed: %v", system, err)
			}
		}
	}
	res, err := h.run(ctx)
	if steps := setupBreakdown(filepath.Join(h.Dir, "helper.log")); steps != "" {
		b.show.line("run %d %s: guest set-up steps: %s", run, system, steps)
		b.results.AddSetupSteps(system, parseSetupSteps(steps))
	}
	b.results.AddRun(system, res.Phases, res.Memory)
	b.addBootWork(system, res.Work)
	if err != nil {
		b.results.AddFailure(system, firstLine(err.Error()))
		b.show.line("run %d %s failed: %v", run, system, err)
	}
}

// measurePeer boots peer p once. A failed boot is recorded as a failure;
// only the end of ctx (or a work directory that cannot be made) is an
// error.
func (b *benchRun) measurePeer(ctx context.Context, run int, p qemuPeer) error {
	b.status(run, p.ID, "booting to /init")
	dir := filepath.Join(b.work, fmt.Sprintf("%s-%d", p.ID, run))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	args, err := p.args(dir)
	if err == nil {
		var res runResult
		res, err = qemuBoot{Qemu: b.qemu, Args: args, Initrd: b.initrd, MemMiB: b.opts.MemMiB, Dir: dir, Timeout: b.opts.Timeout, Meter: b.meter}.run(ctx)
		if err == nil {
			b.results.AddRun(p.ID, res.Phases, res.Memory)
			b.addBootWork(p.ID, res.Work)
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	b.results.AddFailure(p.ID, firstLine(err.Error()))
	b.show.line("run %d %s failed: %v", run, p.ID, err)
	return nil
}

// writeReport writes the report files to opts.Out and returns the report.
func (b *benchRun) writeReport() (Report, error) {
	meta := Report{Date: time.Now().UTC().Truncate(time.Second), Host: hostInfo(b.kvmState), Runs: b.opts.Runs, Backend: b.backend, Notes: b.notes}
	if info, err := os.Stat(b.binary); err == nil {
		meta.BinaryBytes = info.Size()
	}
	rep := b.results.Report(meta)
	if !b.selected(BenchBoot) {
		rep.Runs, rep.Systems, rep.Ratios, rep.BootTargets = 0, nil, nil, nil
	}
	if b.fs != nil {
		rep.FS, rep.Blk = b.fs.report(guestboot.FSSuiteFS), b.fs.report(guestboot.FSSuiteBlk)
	}
	if b.sdk != nil {
		rep.SDK = b.sdk.report()
	}
	rep.Work = b.accounts.Report()
	if err := writeReports(b.opts.Out, rep); err != nil {
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
		return "", errors.New("no --binary: the bench measures a cowork-vmm binary (make build puts one in " + DefaultBinary + ")")
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
