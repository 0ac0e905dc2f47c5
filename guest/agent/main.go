package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/egress/fdpass"
	"github.com/cowork-vmm/cowork-vmm/guest/platformreg"
	"github.com/cowork-vmm/cowork-vmm/guest/proxy"
	"github.com/cowork-vmm/cowork-vmm/guest/timerslack"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// ProcessMain is the process backend's agent mode, `cowork-vmm agent --fd N`:
// the agent's connection is the inherited socket fd N (default 3). It runs
// until shutdown and returns the process exit code (0 after a shutdown).
// args are the arguments after "agent".
func ProcessMain(args []string) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fd := fs.Int("fd", 3, "inherited socket `fd` connected to the helper")
	egressFD := fs.Int("egress-fd", 0, "inherited SOCK_SEQPACKET socket `fd` to pass egress connections to the helper over (0: spawns get no proxy and no network namespace of their own)")
	isolate := fs.Bool("isolate-sessions", false, "isolate sessions as the VM does (Options.IsolateSessions): a uid per session and a root with only its session; needs real root of the initial user namespace, so not the process backend (tests)")
	runDir := fs.String("run-dir", DefaultRunDir, "`directory` of the guest-request sockets of spawns that are not isolated")
	cgroupRoot := fs.String("cgroup-root", "", "a cgroup2 `mount` below which each spawn gets a cgroup of its own (the process backend has none delegated; tests)")
	debug := fs.Bool("debug", false, "log debug messages")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := newLogger(os.Stderr, level)
	if *fd < 3 {
		log.Error("agent: --fd must name an inherited descriptor (3 or more)", "fd", *fd)
		return 2
	}
	f := os.NewFile(uintptr(*fd), "agent-conn")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		log.Error("agent: the --fd descriptor is not a socket", "fd", *fd, "err", err)
		return 2
	}
	opts := Options{Logger: log, Subreaper: true, IsolateSessions: *isolate, RunDir: *runDir, CgroupRoot: *cgroupRoot}
	if *egressFD != 0 {
		if *egressFD < 3 || *egressFD == *fd {
			log.Error("agent: --egress-fd must name another inherited descriptor (3 or more)", "fd", *egressFD)
			return 2
		}
		ef := os.NewFile(uintptr(*egressFD), "egress-conn")
		econn, err := net.FileConn(ef)
		ef.Close()
		unixConn, ok := econn.(*net.UnixConn)
		if err != nil || !ok {
			log.Error("agent: the --egress-fd descriptor is not a Unix socket", "fd", *egressFD, "err", err)
			return 2
		}
		opts.Egress = &fdpass.Dialer{Conn: unixConn}
	}
	notDumpable(log)
	stop := absorbSignals(log)
	defer stop()
	err = Run(context.Background(), conn, opts)
	if errors.Is(err, ErrShutdown) {
		return 0
	}
	log.Error("agent ended", "err", err)
	return 1
}

// VMMain is PID 1 (/init) of the VM: it writes the boot timer, moves off the
// kernel's rootfs (leaveRootfs), mounts the kernel filesystems, dials the
// helper over vsock (host CID 2, guesthost.AgentVSockPort), serves it with
// isolated sessions (Options.IsolateSessions), and powers the VM off (a
// reset, which the VMM treats as the end; the kernel command line has
// reboot=k). It does not return.
func VMMain() {
	log := newLogger(os.Stderr, slog.LevelWarn)
	writeBootTimer(log)
	if err := leaveRootfs(); err != nil {
		// Spawns then fail (closed): their roots need pivot_root.
		log.Error("agent: cannot move off the rootfs; spawned processes cannot be isolated and will not start", "err", err)
	}
	mountKernelFilesystems(log)
	log = newLogger(os.Stderr, consoleLogLevel(readCmdline()))
	notDumpable(log)
	// sysmon's 20 µs sleeps in system calls would each be a timer
	// interrupt (package timerslack).
	if err := timerslack.Raise(timerslack.GuestTick); err != nil {
		log.Info("agent: its timers keep the default slack (more timer interrupts while it is in system calls)", "err", err)
	}
	stop := absorbSignals(log)
	defer stop()
	// The spawns' cgroups are made before the snapshot point, so that a
	// guest restored from the snapshot finds them made.
	cgroups := newCgroups(log, vmCgroupRoot)
	cgroups.parentDir()
	if atSnapshotPoint(log) {
		afterRestore(log)
	}
	serveUntilOff(log, cgroups)
}

// serveUntilOff dials the helper and serves it; after a suspend it waits
// to be saved and, in a VM restored from that state, dials and serves the
// helper again, on the same root. It powers the VM off when a Run ends
// any other way (or the VMM saved nothing).
func serveUntilOff(log *slog.Logger, cgroups *cgroups) {
	keep := &keptState{}
	var wake *stepTimer // a resumed guest's steps up to its dial
	for {
		conn, err := dialHost(log, 60*time.Second)
		wake.done("dial")
		keep.wokeUp(wake)
		if err != nil {
			log.Error("agent: cannot reach the helper over vsock; powering off", "err", err)
			break
		}
		err = Run(context.Background(), conn, Options{Logger: log, Egress: proxy.VSockDialer{}, IsolateSessions: true, CgroupRoot: vmCgroupRoot, cgroups: cgroups,
			DropCachesWhenIdle: idleDropDelay, keep: keep})
		conn.Close() // waits until the helper has what was sent (deliveringConn)
		if !errors.Is(err, ErrSuspended) {
			if !errors.Is(err, ErrShutdown) {
				log.Error("agent ended", "err", err)
			}
			break
		}
		if !awaitSave(log) {
			break
		}
		// The helper's resume request reseeds the generator (its
		// seed, ResumeParams.Seed): reading virtio-rng here cost the
		// resume 50-100 ms nested.
		wake = newStepTimer()
		keep.resume()
	}
	powerOff(log)
}

// notDumpable keeps guest processes from ptracing the agent or reading its
// memory and descriptors through /proc (the egress tokens of every spawn,
// and in the process backend its handle on the host root). Spawned
// processes become dumpable again when they exec.
func notDumpable(log *slog.Logger) {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Warn("agent: cannot make itself non-dumpable; guest processes may inspect it", "err", err)
	}
}

// leaveRootfs moves the agent's root off the kernel's rootfs onto a tmpfs
// mounted over it, as switch_root does (the initramfs is left in place,
// unreachable): pivot_root, with which every isolated spawn's root is made,
// refuses a root that is the rootfs (it has no parent mount), and a spawn's
// namespace that detaches the agent's tree then keeps only the bare
// initramfs below its own root. A /dev mounted already (writeBootTimer)
// moves along.
func leaveRootfs() error {
	const newRoot = "/.root"
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", newRoot, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting the new root: %w", err)
	}
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"tmp", 0o1777}, {"run", 0o755}, {"sessions", 0o755}, {"root", 0o700}} {
		p := newRoot + "/" + d.name
		if err := os.Mkdir(p, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	if err := unix.Mount("/dev", newRoot+"/dev", "", unix.MS_MOVE, ""); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("moving /dev: %w", err) // EINVAL: /dev is no mount point
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the new root over the rootfs: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("entering the new root: %w", err)
	}
	return unix.Chdir("/")
}

// vmCgroupRoot is where the VM's agent mounts cgroup v2 (the spawns'
// cgroups, cgroup.go).
const vmCgroupRoot = "/sys/fs/cgroup"

// mountKernelFilesystems mounts /proc, /sys, /sys/fs/cgroup (cgroup v2),
// /dev, /dev/pts, /dev/shm and /tmp; failures are logged, not fatal (the
// helper hears about what is missing).
func mountKernelFilesystems(log *slog.Logger) {
	for _, m := range []struct {
		source, target, fstype, data string
		flags                        uintptr
	}{
		{"proc", "/proc", "proc", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"sysfs", "/sys", "sysfs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"cgroup2", vmCgroupRoot, "cgroup2", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755", unix.MS_NOSUID},
		{"devpts", "/dev/pts", "devpts", "ptmxmode=0666,mode=0620", unix.MS_NOSUID | unix.MS_NOEXEC},
		{"tmpfs", "/dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
	} {
		if m.fstype == "devtmpfs" {
			if _, err := os.Stat("/dev/null"); err == nil {
				continue // mounted already (by writeBootTimer or the kernel)
			}
		}
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			log.Warn("cannot create a mount point", "path", m.target, "err", err)
			continue
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			log.Warn("cannot mount", "fstype", m.fstype, "path", m.target, "err", err)
		}
	}
	for name, target := range map[string]string{"/dev/fd": "/proc/self/fd", "/dev/ptmx": "pts/ptmx"} {
		if _, err := os.Lstat(name); err != nil {
			_ = os.Symlink(target, name)
		}
	}
}

// writeBootTimer tells the VMM that the guest reached userspace: one byte,
// guesthost.BootTimerMagic, to the boot timer's register. On x86 it tries
// outb after ioperm first, which needs no /dev. Failure is only logged.
func writeBootTimer(log *slog.Logger) {
	err := writePortByte(guesthost.BootTimerPort, guesthost.BootTimerMagic)
	if err == nil {
		return
	}
	if _, serr := os.Stat(platformreg.BootTimer.Device()); serr != nil {
		_ = os.MkdirAll("/dev", 0o755)
		_ = unix.Mount("devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755")
	}
	if rerr := platformreg.WriteOnce(platformreg.BootTimer, guesthost.BootTimerMagic); rerr != nil {
		log.Warn("boot timer not written", "outb", err, "register", rerr)
	}
}

// dialHost dials the helper over vsock, retrying until timeout.
func dialHost(log *slog.Logger, timeout time.Duration) (io.ReadWriteCloser, error) {
	deadline := time.Now().Add(timeout)
	delay := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		conn, err := dialVSock()
		if err == nil {
			return conn, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("dialing vsock host port after %d attempts: %w", attempt, err)
		}
		if attempt == 1 || attempt%50 == 0 {
			log.Warn("helper not reachable over vsock yet; retrying", "err", err, "attempt", attempt)
		}
		time.Sleep(delay)
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// powerOff syncs and resets the machine; the VMM treats the reset as the end.
func powerOff(log *slog.Logger) {
	unix.Sync()
	log.Info("powering off")
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		log.Error("reboot failed", "err", err)
	}
	// PID 1 must not exit (the kernel would panic); wait for the reset.
	select {}
}

// absorbSignals keeps terminating signals from ending the agent: as PID 1 a
// guest process could otherwise kill it. The handlers do not survive exec, so
// spawned processes keep default dispositions.
func absorbSignals(log *slog.Logger) (stop func()) {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGPIPE)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-ch:
				log.Info("agent ignoring signal", "signal", s.String())
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// consoleLogLevel is the agent's log level in the VM, whose log is the
// serial console: warnings and errors, or everything with cowork.debug on
// the kernel command line (the helper's GuestDebug). Each console byte
// costs the vCPU two or more port I/O exits and the tty's drain competes
// with the agent for it, so an info line (~120 bytes: "process started",
// "stepped the guest's wall clock") cost a set-up step ~100 ms and a spawn
// two of them, nested; the helper logs the same events on its side.
func consoleLogLevel(cmdline string) slog.Level {
	if slices.Contains(strings.Fields(cmdline), guesthost.DebugCmdlineFlag) {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("component", "agent")
}

func readCmdline() string {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return ""
	}
	return string(b)
}
