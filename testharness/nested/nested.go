package nested

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"compress/gzip"

	"github.com/cowork-vmm/cowork-vmm/guest/initramfs"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// Defaults of Options.
const (
	DefaultMemMiB  = 2048
	DefaultCPUs    = 1
	DefaultTimeout = 10 * time.Minute
	// bootAllowance is added to the payload timeout for qemu's own deadline:
	// the outer boot, the payload's teardown and the restart.
	bootAllowance = 2 * time.Minute
	outerInitPkg  = "github.com/cowork-vmm/cowork-vmm/testharness/nested/outerinit"
	qemuBinary    = "qemu-system-x86_64"
)

// Options describe one harness run.
type Options struct {
	// Arch is the outer guest's architecture, a GOARCH: "" or ArchAMD64
	// (qemu-system-x86_64 with nested SVM, the host's root shared), or
	// ArchARM64 (qemu-system-aarch64 -M virt at EL2, the arm64 userland).
	// Payload programs must be built for it.
	Arch string
	// PayloadDir is shared read-write with the outer guest at /payload.
	// Empty: a temporary directory, removed after the run.
	PayloadDir string
	// Files are copied into PayloadDir before the run: guest path
	// ("bin/x" or "/payload/bin/x") -> host path. Modes are kept.
	Files map[string]string
	// Cmd is the payload command. A Cmd[0] without a slash is looked up in
	// the guest's PATH (the host's /usr/bin etc.; the arm64 userland's on arm64).
	Cmd []string
	// Env is added to the payload's environment (KEY=value).
	Env []string
	// Dir is the payload's working directory in the guest; default /payload.
	// The host's directories are visible read-only at their own paths,
	// except those under /tmp, /run, /root and /var/tmp (job.HiddenInGuest);
	// on arm64 none of them are.
	Dir string
	// Shares are host directories to make visible read-only at their own
	// paths even there (at most job.MaxShares).
	Shares []string
	// MemMiB and CPUs size the outer guest (defaults 2048 and 1).
	MemMiB int
	CPUs   int
	// SingleThreadTCG runs several outer CPUs on one host thread, in turn
	// (-accel tcg,thread=single), instead of one thread each: slower, but
	// without the multi-threaded emulator's memory-ordering effects.
	SingleThreadTCG bool
	// Timeout bounds the payload inside the guest (default 10 min); qemu
	// itself is killed a little later if the guest does not finish.
	Timeout time.Duration
	// Stdout, when set, receives the outer guest's serial console live.
	Stdout io.Writer
	// Kernel overrides the outer kernel (default: kernel.Find("outer"), on
	// arm64 the "outer-arm64" flavour's Image).
	Kernel string
	// Append is added to the outer kernel's command line (e.g. loglevel=7
	// to see its boot messages; later words win).
	Append string
	// QemuLog, when set, is a file for qemu's own log of the outer CPUs'
	// resets and guest errors (-d cpu_reset,guest_errors): the register
	// dump of an outer guest that triple-faults, which the console never
	// shows under -no-reboot.
	QemuLog string
	// GICv2 gives the arm64 outer guest a GICv2 (with its virtualization
	// extensions) instead of a GICv3, as a Raspberry Pi 4 or 5 has: its
	// KVM can then give guests only a GICv2.
	GICv2 bool
	// Pages16K boots the arm64 outer guest's kernel built with 16 KiB
	// pages (make kernel-outer-16k-arm64), the page size of Apple Silicon
	// under Asahi Linux and of Raspberry Pi OS on a Raspberry Pi 5.
	Pages16K bool

	// tscKHz is the host's TSC rate, which the outer guest's TSC runs at
	// (Run measures it: hostTSCkHz); 0 means defaultTSCkHz.
	tscKHz int64
	// userland is the arm64 outer guest's root (Run finds it:
	// arm64Userland), shared read-only as job.UserlandTag.
	userland string
}

// Result of a run.
type Result struct {
	// ExitCode is the payload's exit status (128+signal when killed by a
	// signal, 124 when it exceeded Options.Timeout).
	ExitCode int
	// Output is the payload's stdout and stderr as printed on the console.
	Output string
	// Console is the whole serial console of the outer guest.
	Console string
	// Wall is the time from qemu's start to its exit.
	Wall time.Duration
	// InitUptime is the outer guest's uptime when its /init started, and
	// InitWall the wall time from qemu's start to /init's first line.
	InitUptime time.Duration
	InitWall   time.Duration
	// Clocksources are the outer kernel's clocksource before the payload
	// started and after it ended (one entry when both are the same): the
	// clock every time measured inside the outer guest comes from.
	Clocksources []string
}

// Clocksource is the clocksource the run ended on ("" if unreported).
func (r Result) Clocksource() string {
	if len(r.Clocksources) == 0 {
		return ""
	}
	return r.Clocksources[len(r.Clocksources)-1]
}

// ClockNote names the outer clocksource(s) for a run's summary line, with
// a warning when they were coarse.
func (r Result) ClockNote() string {
	if len(r.Clocksources) == 0 {
		return "outer clocksource unreported"
	}
	note := "outer clocksource " + strings.Join(r.Clocksources, " then ")
	if r.CoarseClock() {
		note += " (COARSE: times inside come in timer-tick steps)"
	}
	return note
}

// CoarseClock reports whether the outer kernel kept time with a tick-based
// clocksource at some point of the payload: times measured inside then
// come in timer-tick steps (4 ms), and a report says so at its top.
func (r Result) CoarseClock() bool {
	for _, c := range r.Clocksources {
		if job.CoarseClocksource(c) {
			return true
		}
	}
	return false
}

// Available reports why the harness cannot run here, or nil.
func Available() error {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		return fmt.Errorf("nested harness needs linux/amd64, this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	if _, err := exec.LookPath(qemuBinary); err != nil {
		return fmt.Errorf("nested harness needs %s (apt-get install qemu-system-x86): %w", qemuBinary, err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		return fmt.Errorf("nested harness builds its outer /init with the go tool, not in PATH: %w", err)
	}
	if _, err := kernel.Find(kernel.Outer); err != nil {
		return err
	}
	return nil
}

// Run boots the outer guest under qemu's emulator with nested SVM, runs
// opts.Cmd inside and returns its result. An error means the harness could
// not get a result (qemu failed, the guest did not finish in time, the
// outer /init could not run the command); a payload that fails is a Result
// with a non-zero ExitCode.
func Run(ctx context.Context, opts Options) (Result, error) {
	if len(opts.Cmd) == 0 {
		return Result{}, errors.New("nested: empty command")
	}
	arch, err := normalArch(opts.Arch)
	if err != nil {
		return Result{}, err
	}
	opts.Arch = arch
	if (opts.GICv2 || opts.Pages16K) && arch != ArchARM64 {
		return Result{}, errors.New("nested: GICv2 and Pages16K are options of the arm64 harness")
	}
	opts.setDefaults()
	if opts.Kernel == "" {
		k, err := outerKernel(arch, opts.Pages16K)
		if err != nil {
			return Result{}, fmt.Errorf("nested: %w", err)
		}
		opts.Kernel = k
	}
	work, err := os.MkdirTemp("", "cowork-nested-")
	if err != nil {
		return Result{}, fmt.Errorf("nested: %w", err)
	}
	defer os.RemoveAll(work)
	if opts.PayloadDir == "" {
		opts.PayloadDir = filepath.Join(work, "payload")
		if err := os.Mkdir(opts.PayloadDir, 0o755); err != nil {
			return Result{}, fmt.Errorf("nested: %w", err)
		}
	}
	payload, err := filepath.Abs(opts.PayloadDir)
	if err != nil {
		return Result{}, fmt.Errorf("nested: payload dir: %w", err)
	}
	if err := copyFiles(payload, opts.Files); err != nil {
		return Result{}, err
	}
	token, err := newToken()
	if err != nil {
		return Result{}, err
	}
	j := job.Job{Token: token, Cmd: opts.Cmd, Env: opts.Env, Dir: opts.Dir, Timeout: opts.Timeout, Shares: opts.Shares, UserlandRoot: arch == ArchARM64}
	if err := j.Validate(); err != nil {
		return Result{}, fmt.Errorf("nested: %w", err)
	}
	initrd := filepath.Join(work, "outer.cpio.gz")
	if err := buildOuterInitramfs(ctx, work, initrd, arch, j); err != nil {
		return Result{}, err
	}
	if arch == ArchAMD64 {
		opts.tscKHz = hostTSCkHz(tscWindow)
	} else if opts.userland, err = arm64Userland(); err != nil {
		return Result{}, err
	}
	return runQemu(ctx, opts, payload, initrd, token)
}

func (o *Options) setDefaults() {
	if o.MemMiB <= 0 {
		o.MemMiB = DefaultMemMiB
	}
	if o.CPUs <= 0 {
		o.CPUs = DefaultCPUs
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Dir == "" {
		o.Dir = job.PayloadDir
	}
}

func newToken() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("nested: token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// copyFiles copies opts.Files into the payload directory.
func copyFiles(payload string, files map[string]string) error {
	for guestPath, hostPath := range files {
		rel := strings.TrimPrefix(guestPath, job.PayloadDir+"/")
		if rel == "" || filepath.IsAbs(rel) || !filepath.IsLocal(rel) {
			return fmt.Errorf("nested: file %q: guest paths are relative to %s (e.g. bin/tool)", guestPath, job.PayloadDir)
		}
		dst := filepath.Join(payload, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("nested: %w", err)
		}
		if err := copyFile(dst, hostPath); err != nil {
			return fmt.Errorf("nested: copying %s to %s: %w", hostPath, guestPath, err)
		}
	}
	return nil
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	info, err := in.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, info.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, info.Mode().Perm())
}

// buildOuterInitramfs compiles outerinit (static, for arch) and packs it
// as /init with the job. (The arm64 userland is shared, not packed: it
// holds a qemu and its libraries, some 150 MB.)
func buildOuterInitramfs(ctx context.Context, work, initrd, arch string, j job.Job) error {
	initBin := filepath.Join(work, "outerinit")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", initBin, outerInitPkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nested: building the outer /init (run from inside the cowork-vmm module): %w\n%s", err, out)
	}
	jobJSON, err := json.Marshal(j)
	if err != nil {
		return fmt.Errorf("nested: %w", err)
	}
	files := []initramfs.File{
		{Path: "init", Mode: 0o755, HostPath: initBin},
		{Path: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, Major: 5, Minor: 1},
		{Path: strings.TrimPrefix(job.Path, "/"), Mode: 0o644, Data: jobJSON},
	}
	f, err := os.Create(initrd)
	if err != nil {
		return fmt.Errorf("nested: %w", err)
	}
	if err := initramfs.WriteGzip(f, files, gzip.BestSpeed); err != nil {
		f.Close()
		return fmt.Errorf("nested: outer initramfs: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("nested: outer initramfs: %w", err)
	}
	return nil
}

// outerCmdline: console on the serial port; reboot=t so /init's restart is
// a triple fault, which ends qemu under -no-reboot (microvm has no other
// reset path); panic=-1 the same on a panic; quiet because every console
// byte is slow under emulation. (no_timer_check made nested KVM guests
// starve the outer kernel here: keep the IO-APIC timer check.)
// tsc_early_khz: under TCG the outer kernel cannot calibrate its TSC (cpu
// MHz 0), and its KVM then never enters a guest (KVM_RUN loops with zero
// exits until kicked); a given TSC frequency makes nested guests run. It
// is the host's (hostTSCkHz): TCG's TSC is the host's, and a wrong rate
// makes the outer clock run fast or slow by the ratio.
// tsc=reliable clocksource=tsc: keep time with the TSC, which TCG reads
// from the host's (fine-grained, the same on every outer CPU). Without
// them the kernel can find a qemu64 TSC (AMD, no invariant TSC) on several
// CPUs "unsynchronized", or its watchdog find it skewed under emulation,
// mark it unstable and, microvm having no HPET nor ACPI PM timer, fall
// back to jiffies: every time measured inside then came in 4 ms steps.
func outerCmdline(tscKHz int64) string {
	if tscKHz <= 0 {
		tscKHz = defaultTSCkHz
	}
	return fmt.Sprintf("console=ttyS0 reboot=t panic=-1 quiet tsc_early_khz=%d tsc=reliable clocksource=tsc", tscKHz)
}

// outerCPU is the outer guest's CPU model: qemu64 with nested SVM and
// nested paging (TCG has no nrip-save; asking for it only warns), raised to
// the x86-64-v2 baseline (SSE3, SSSE3, SSE4.1, SSE4.2, POPCNT, CMPXCHG16B,
// LAHF/SAHF in long mode), which every x86-64 desktop of the last fifteen
// years has and real programs are built for: qemu64 alone lacks SSSE3,
// SSE4.x and POPCNT, and the Claude Code CLI died of SIGILL (ptest, SSE4.1)
// in the outer guest and in every guest inside it. qemu 7.2's TCG emulates
// all of these (no "TCG doesn't support" warning). Nothing of v3 (AVX,
// XSAVE): a larger AVX/XSAVE set hung the outer guest in one try.
const outerCPU = "qemu64,+svm,+npt,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+lahf_lm"

// qemuArgs is the outer guest's command line (NESTED-TEST.md's recipe).
func qemuArgs(opts Options, payload, initrd string) []string {
	if opts.Arch == ArchARM64 {
		return qemuArgsARM64(opts, payload, initrd)
	}
	return outerQemuArgs(opts, "microvm,acpi=off", outerCPU, outerCmdline(opts.tscKHz), initrd,
		append(ninePDevice("hostroot", "/", job.HostRootTag, true), ninePDevice("payload", payload, job.PayloadTag, false)...)...)
}

// outerQemuArgs is the command line both outer guests share: qemu's
// emulator (one thread per CPU unless opts.SingleThreadTCG), machine and
// cpu, the kernel, initrd and cmdline (with opts.Append), no reboot (the
// guest's restart ends qemu), then devices, the CPU-reset log and the
// shares.
func outerQemuArgs(opts Options, machine, cpu, cmdline, initrd string, devices ...string) []string {
	accel := "tcg"
	if opts.CPUs > 1 && !opts.SingleThreadTCG {
		accel = "tcg,thread=multi"
	}
	args := []string{
		"-accel", accel,
		"-M", machine,
		"-cpu", cpu,
		"-m", strconv.Itoa(opts.MemMiB),
		"-smp", strconv.Itoa(opts.CPUs),
		"-nodefaults", "-no-user-config", "-nographic",
		"-serial", "stdio",
		"-kernel", opts.Kernel,
		"-initrd", initrd,
		"-append", strings.TrimSpace(cmdline + " " + opts.Append),
		"-no-reboot",
	}
	args = append(args, devices...)
	if opts.QemuLog != "" {
		args = append(args, "-d", "cpu_reset,guest_errors", "-D", opts.QemuLog)
	}
	return append(args, shareArgs(opts.Shares)...)
}

// ninePDevice is a virtio-9p device sharing path under mount tag tag.
func ninePDevice(id, path, tag string, readOnly bool) []string {
	fsdev := "local,id=" + id + ",path=" + path + ",security_model=none"
	if readOnly {
		fsdev += ",readonly=on"
	}
	return []string{"-fsdev", fsdev, "-device", "virtio-9p-device,fsdev=" + id + ",mount_tag=" + tag}
}

func runQemu(ctx context.Context, opts Options, payload, initrd, token string) (Result, error) {
	deadline := opts.Timeout + bootAllowance
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	runCtx, kill := context.WithCancel(ctx) // kill: the outer guest froze
	defer kill()
	cmd := exec.CommandContext(runCtx, qemuBinaryFor(opts.Arch), qemuArgs(opts, payload, initrd)...)
	cmd.WaitDelay = 5 * time.Second
	var console bytes.Buffer
	var mu sync.Mutex
	start := time.Now()
	initSeen := &markerWatch{start: start, marker: []byte(job.Marker(job.MarkerInit, token, ""))}
	begin := &markerWatch{start: start, marker: []byte(job.Marker(job.MarkerBegin, token, ""))}
	alive := &markerWatch{start: start, marker: []byte(job.Marker(job.MarkerAlive, token, ""))}
	sink := io.Writer(&lockedWriter{mu: &mu, w: io.MultiWriter(&console, initSeen, begin, alive)})
	if opts.Stdout != nil {
		sink = io.MultiWriter(sink, opts.Stdout)
	}
	cmd.Stdout = sink
	cmd.Stderr = sink
	var froze atomic.Pointer[string] // why the run counts as frozen
	runErr := cmd.Start()
	if runErr == nil {
		go watchFreeze(runCtx, cmd.Process.Pid, freezeWindow, freezeCPU, freezeSample, func() {
			why := fmt.Sprintf("qemu used no CPU for %v", freezeWindow)
			froze.CompareAndSwap(nil, &why)
			kill()
		})
		go watchHeartbeat(runCtx, begin, alive, stallWindow, freezeSample, func(silent time.Duration) {
			why := fmt.Sprintf("its heartbeat stopped for %v while qemu ran", silent.Round(time.Second))
			froze.CompareAndSwap(nil, &why)
			kill()
		})
		runErr = cmd.Wait()
	}
	wall := time.Since(start)

	mu.Lock()
	text := strings.ReplaceAll(console.String(), "\r", "")
	mu.Unlock()
	res, parseErr := parseConsole(text, token)
	res.Wall = wall
	res.InitWall, _ = initSeen.seen()
	res.Console = text
	switch {
	case froze.Load() != nil && parseErr != nil:
		return res, fmt.Errorf("nested: %w: %s; qemu killed after %v; console tail:\n%s", ErrOuterFroze, *froze.Load(), wall.Round(time.Second), tail(text, 30))
	case ctx.Err() != nil && parseErr != nil:
		return res, fmt.Errorf("nested: outer guest did not finish within %v; qemu killed; console tail:\n%s", deadline, tail(text, 30))
	case parseErr != nil && runErr != nil:
		return res, fmt.Errorf("nested: qemu: %w; %v; console tail:\n%s", runErr, parseErr, tail(text, 30))
	case parseErr != nil:
		return res, fmt.Errorf("nested: %w; console tail:\n%s", parseErr, tail(text, 30))
	}
	return res, nil
}

// parseConsole extracts the payload's result from the serial console.
func parseConsole(text, token string) (Result, error) {
	var res Result
	var out strings.Builder
	inPayload, exited := false, false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		before, kind, value, ok := parseMarker(line, token)
		if !ok {
			if inPayload {
				out.WriteString(line)
				out.WriteByte('\n')
			}
			continue
		}
		if inPayload && before != "" {
			out.WriteString(before)
			out.WriteByte('\n')
		}
		switch kind {
		case job.MarkerInit:
			if secs, err := strconv.ParseFloat(strings.TrimPrefix(value, "uptime="), 64); err == nil {
				res.InitUptime = time.Duration(secs * float64(time.Second))
			}
		case job.MarkerClock:
			if n := len(res.Clocksources); value != "" && n < 8 && (n == 0 || res.Clocksources[n-1] != value) {
				res.Clocksources = append(res.Clocksources, value)
			}
		case job.MarkerBegin:
			inPayload = true
		case job.MarkerExit:
			code, err := strconv.Atoi(value)
			if err != nil {
				return res, fmt.Errorf("bad exit marker %q", line)
			}
			res.ExitCode, exited, inPayload = code, true, false
		case job.MarkerError:
			res.Output = out.String()
			return res, fmt.Errorf("outer /init: %s", value)
		}
	}
	res.Output = out.String()
	if !exited {
		return res, errors.New("the outer guest ended without reporting the payload's exit status")
	}
	return res, nil
}

// parseMarker recognises "KIND TOKEN[ VALUE]". A marker may follow other
// output on the same line when the payload did not end with a newline.
func parseMarker(line, token string) (before, kind, value string, ok bool) {
	for _, k := range []string{job.MarkerInit, job.MarkerClock, job.MarkerBegin, job.MarkerAlive, job.MarkerExit, job.MarkerError} {
		prefix := k + " " + token
		i := strings.Index(line, prefix)
		if i < 0 {
			continue
		}
		rest := line[i+len(prefix):]
		if rest != "" && rest[0] != ' ' {
			continue
		}
		return line[:i], k, strings.TrimPrefix(rest, " "), true
	}
	return "", "", "", false
}

func tail(text string, lines int) string {
	all := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
