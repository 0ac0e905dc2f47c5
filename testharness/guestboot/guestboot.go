package guestboot

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/initramfs"
)

const (
	testInitPkg = "github.com/cowork-vmm/cowork-vmm/testharness/guestboot/testinit"
	// ReadyMarker starts the console line testinit prints once it runs.
	ReadyMarker = "TESTINIT OK"
	// DoneMarker is printed after the boot timer write, before the restart.
	DoneMarker = "TESTINIT DONE"
	// QemuCmdline is qemu's kernel command line, machine.DefaultCmdline's
	// equivalent: microvm has no i8042, so the restart is a triple fault
	// (reboot=t), which ends qemu under -no-reboot; quiet keeps the console
	// (an exit per byte) out of the figure.
	QemuCmdline = "console=ttyS0 panic=-1 pci=off no_timer_check quiet reboot=t"
	// QemuVirtCmdline is qemu -M virt's on arm64: the console is virt's
	// PL011 (ttyAMA0; our VMM's is a 16550, ttyS0), and testinit's restart
	// is PSCI SYSTEM_RESET, which ends qemu under -no-reboot.
	QemuVirtCmdline = "console=ttyAMA0 panic=-1 quiet"
)

// VMM names of the Boot figures.
const (
	VMMCowork      = "cowork-vmm"
	VMMQemuMicrovm = "qemu-microvm"
	VMMQemuVirt    = "qemu-virt"
)

// Env names of the test guest's files inside the nested guest.
const (
	EnvKernel = "GUESTBOOT_KERNEL"
	EnvInitrd = "GUESTBOOT_INITRD"
)

// BuildInitramfs compiles testinit (static) and writes a gzip initramfs
// with it as /init to out. Run from inside the cowork-vmm module.
func BuildInitramfs(ctx context.Context, out string) error {
	return BuildInitramfsFor(ctx, out, "amd64")
}

// BuildInitramfsFor is BuildInitramfs for a guest of another architecture
// (a GOARCH: "amd64", "arm64").
func BuildInitramfsFor(ctx context.Context, out, goarch string) error {
	dir, err := os.MkdirTemp("", "guestboot-")
	if err != nil {
		return fmt.Errorf("guestboot: %w", err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "init")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, testInitPkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("guestboot: building testinit: %w\n%s", err, msg)
	}
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("guestboot: %w", err)
	}
	files := []initramfs.File{
		{Path: "init", Mode: 0o755, HostPath: bin},
		{Path: "dev/console", Mode: os.ModeDevice | os.ModeCharDevice | 0o600, Major: 5, Minor: 1},
		{Path: "dev", Mode: os.ModeDir | 0o755},
		{Path: "proc", Mode: os.ModeDir | 0o755},
		{Path: "sys", Mode: os.ModeDir | 0o755},
	}
	if err := initramfs.WriteGzip(f, files, gzip.BestSpeed); err != nil {
		f.Close()
		return fmt.Errorf("guestboot: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("guestboot: %w", err)
	}
	return nil
}

// Boot is one timed boot of the test guest.
type Boot struct {
	VMM  string // "cowork-vmm" or "qemu-microvm"
	CPUs int
	// Ready is the wall time from starting the VMM to testinit's ready line.
	Ready time.Duration
	// BootTimer is our VMM's boot-timer figure (start of the VM to the
	// guest's write); zero for qemu.
	BootTimer time.Duration
	// Exit is the wall time from starting the VMM to the VM's end.
	Exit time.Duration
	// GuestUptime is the guest's own uptime when testinit started.
	GuestUptime time.Duration
	// GuestCPUs is what the guest reported online ("0-1").
	GuestCPUs string
}

// FigureLine formats b as the line the host-side test parses.
func (b Boot) FigureLine() string {
	return fmt.Sprintf("BOOTFIGURE vmm=%s cpus=%d ready_ms=%.1f boottimer_ms=%.1f exit_ms=%.1f uptime_ms=%.1f online=%s",
		b.VMM, b.CPUs, ms(b.Ready), ms(b.BootTimer), ms(b.Exit), ms(b.GuestUptime), b.GuestCPUs)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ParseFigureLine parses a FigureLine (possibly with a prefix).
func ParseFigureLine(line string) (Boot, bool) {
	i := strings.Index(line, "BOOTFIGURE ")
	if i < 0 {
		return Boot{}, false
	}
	var b Boot
	for _, field := range strings.Fields(line[i+len("BOOTFIGURE "):]) {
		key, value, ok := strings.Cut(field, "=")
		if !ok {
			return Boot{}, false
		}
		switch key {
		case "vmm":
			b.VMM = value
		case "cpus":
			n, err := strconv.Atoi(value)
			if err != nil {
				return Boot{}, false
			}
			b.CPUs = n
		case "online":
			b.GuestCPUs = value
		case "ready_ms", "boottimer_ms", "exit_ms", "uptime_ms":
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return Boot{}, false
			}
			d := time.Duration(v * float64(time.Millisecond))
			switch key {
			case "ready_ms":
				b.Ready = d
			case "boottimer_ms":
				b.BootTimer = d
			case "exit_ms":
				b.Exit = d
			case "uptime_ms":
				b.GuestUptime = d
			}
		}
	}
	return b, b.VMM != ""
}

// ConsoleWatcher is an io.Writer for a VM's serial console that notes when
// testinit's lines appear. Feed it the console; read it after the VM ended.
type ConsoleWatcher struct {
	mu    sync.Mutex
	start time.Time
	line  bytes.Buffer
	all   bytes.Buffer
	// onReady, when set, is called once, when the ready line arrives (with
	// the watcher locked: it must not call the watcher).
	onReady func()
	ready   time.Duration
	uptime  time.Duration
	cpus    string
	done    bool
}

// NewConsoleWatcher measures from start.
func NewConsoleWatcher(start time.Time) *ConsoleWatcher { return &ConsoleWatcher{start: start} }

// NewConsoleWatcherNotify is NewConsoleWatcher calling onReady (if not nil)
// when the ready line arrives, before anything else is written: the moment
// a bench samples the VMM's work at.
func NewConsoleWatcherNotify(start time.Time, onReady func()) *ConsoleWatcher {
	return &ConsoleWatcher{start: start, onReady: onReady}
}

// Write implements io.Writer. Safe for concurrent use.
func (w *ConsoleWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all.Write(p)
	for _, c := range p {
		if c != '\n' {
			w.line.WriteByte(c)
			continue
		}
		w.handleLine(strings.TrimRight(w.line.String(), "\r"))
		w.line.Reset()
	}
	return len(p), nil
}

func (w *ConsoleWatcher) handleLine(line string) {
	if i := strings.Index(line, ReadyMarker); i >= 0 && w.ready == 0 {
		w.ready = time.Since(w.start)
		if w.onReady != nil {
			w.onReady()
		}
		for _, f := range strings.Fields(line[i+len(ReadyMarker):]) {
			if v, ok := strings.CutPrefix(f, "uptime="); ok {
				if secs, err := strconv.ParseFloat(v, 64); err == nil {
					w.uptime = time.Duration(secs * float64(time.Second))
				}
			}
			if v, ok := strings.CutPrefix(f, "cpus="); ok {
				w.cpus = v
			}
		}
	}
	if strings.Contains(line, DoneMarker) {
		w.done = true
	}
}

// Ready reports the wall time to the ready line, testinit's uptime and
// online CPUs then, and whether the line appeared.
func (w *ConsoleWatcher) Ready() (wall, uptime time.Duration, cpus string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ready, w.uptime, w.cpus, w.ready != 0
}

// Done reports whether testinit got past the boot timer write.
func (w *ConsoleWatcher) Done() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done
}

// Console is everything written so far.
func (w *ConsoleWatcher) Console() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

// QemuMicrovm boots kernel+initrd with qemu -enable-kvm -M microvm and
// times it. The caller bounds it with ctx (a KVM emulation failure pauses
// qemu forever).
func QemuMicrovm(ctx context.Context, kernel, initrd string, cpus, memMiB int, console io.Writer) (Boot, error) {
	return QemuMicrovmWith(ctx, QemuOptions{Kernel: kernel, Initrd: initrd, CPUs: cpus, MemMiB: memMiB, Console: console})
}

// QemuOptions configure QemuMicrovmWith.
type QemuOptions struct {
	// Qemu is the qemu-system-x86_64 binary; default from PATH.
	Qemu string
	// Machine is the -M value; default "microvm".
	Machine        string
	Kernel, Initrd string
	CPUs, MemMiB   int
	// Append is added to QemuCmdline.
	Append string
	// Args are extra qemu arguments (devices).
	Args []string
	// Console, when set, also receives the serial console.
	Console io.Writer
	// OnStart, when set, is told qemu's pid once it has started (the
	// bench's work accounting samples the process).
	OnStart func(pid int)
	// OnReady, when set, is called when testinit's ready line arrives.
	OnReady func()
}

// QemuMicrovmWith is QemuMicrovm with extra kernel arguments and devices.
func QemuMicrovmWith(ctx context.Context, o QemuOptions) (Boot, error) {
	if o.Machine == "" {
		o.Machine = "microvm"
	}
	if o.Qemu == "" {
		o.Qemu = "qemu-system-x86_64"
	}
	args := []string{
		"-enable-kvm", "-M", o.Machine, "-cpu", "host",
		"-m", strconv.Itoa(o.MemMiB), "-smp", strconv.Itoa(o.CPUs),
		"-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio",
		"-kernel", o.Kernel, "-initrd", o.Initrd,
		"-append", strings.TrimSpace(QemuCmdline + " " + o.Append), "-no-reboot",
	}
	return runQemuBoot(ctx, o, VMMQemuMicrovm, append(args, o.Args...))
}

// QemuVirt boots an arm64 Image and initrd with qemu-system-aarch64
// -M virt,gic-version=3 -accel kvm -cpu host (no firmware: -kernel boots
// the Image directly) and times it, as QemuMicrovmWith does on x86: the
// reference our VMM's arm64 boot is compared with. The caller bounds it
// with ctx.
func QemuVirt(ctx context.Context, o QemuOptions) (Boot, error) {
	if o.Machine == "" {
		o.Machine = "virt,gic-version=3"
	}
	if o.Qemu == "" {
		o.Qemu = "qemu-system-aarch64"
	}
	return runQemuBoot(ctx, o, VMMQemuVirt, qemuVirtArgs(o))
}

// qemuVirtArgs is QemuVirt's command line.
func qemuVirtArgs(o QemuOptions) []string {
	args := []string{
		"-accel", "kvm", "-M", o.Machine, "-cpu", "host",
		"-m", strconv.Itoa(o.MemMiB), "-smp", strconv.Itoa(o.CPUs),
		"-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio",
		"-kernel", o.Kernel, "-initrd", o.Initrd,
		"-append", strings.TrimSpace(QemuVirtCmdline + " " + o.Append), "-no-reboot",
	}
	return append(args, o.Args...)
}

// runQemuBoot runs o.Qemu with args and times testinit's boot as vmm.
func runQemuBoot(ctx context.Context, o QemuOptions, vmm string, args []string) (Boot, error) {
	start := time.Now()
	watch := NewConsoleWatcherNotify(start, o.OnReady)
	cmd := exec.CommandContext(ctx, o.Qemu, args...)
	cmd.WaitDelay = 2 * time.Second
	var sink io.Writer = watch
	if o.Console != nil {
		sink = io.MultiWriter(watch, o.Console)
	}
	cmd.Stdout, cmd.Stderr = sink, sink
	err := cmd.Start()
	if err == nil {
		if o.OnStart != nil {
			o.OnStart(cmd.Process.Pid)
		}
		err = cmd.Wait()
	}
	b := Boot{VMM: vmm, CPUs: o.CPUs, Exit: time.Since(start)}
	var ok bool
	b.Ready, b.GuestUptime, b.GuestCPUs, ok = watch.Ready()
	if !ok {
		return b, fmt.Errorf("%s: testinit never reported (err %v); console:\n%s", vmm, err, tailLines(watch.Console(), 40))
	}
	if err != nil {
		return b, fmt.Errorf("%s: %w", vmm, err)
	}
	return b, nil
}

// TailLines is the last n lines of s (a console transcript, for errors).
func TailLines(s string, n int) string { return tailLines(s, n) }

func tailLines(s string, n int) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
