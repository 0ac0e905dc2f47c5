//go:build linux

// Command outerinit is /init of the nested harness's outer guest: a Linux
// booted by qemu's emulator with nested SVM, so it has a real /dev/kvm.
//
// It mounts proc, sys and devtmpfs, mounts the host's root (virtio-9p, read
// only) and builds a root for the payload out of it: a tmpfs with the host's
// top-level directories bind-mounted read-only and fresh tmpfs on /tmp, /run,
// /var/tmp and /root (as virtme-ng does). A job with UserlandRoot (the arm64
// outer guest, to which the host's root is useless) gets the arm64 userland
// the harness shares (virtio-9p, read only) under a tmpfs overlay instead,
// with busybox's applets linked where no package provides the name, a
// minimal /etc and debugfs. The payload
// directory (virtio-9p, read-write) appears at /payload. It then runs the
// job's command with a timeout, its output going to the serial console
// between marker lines, and restarts the machine, which ends qemu
// (-no-reboot: a triple fault on x86, PSCI SYSTEM_RESET on arm64).
//
// The harness builds it with CGO_ENABLED=0 at run time; it must stay static.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

const (
	hostRoot = "/host"
	newRoot  = "/newroot"
	// msize 256 KiB: measured to keep 9p reads of big binaries fast.
	ninePOptions = "trans=virtio,version=9p2000.L,msize=262144"
)

func main() {
	console := os.Stdout
	token := "unknown"
	code, err := run(console, &token)
	if err != nil {
		fmt.Fprintln(console, job.Marker(job.MarkerError, token, strings.ReplaceAll(err.Error(), "\n", " | ")))
	} else {
		fmt.Fprintln(console, job.Marker(job.MarkerExit, token, strconv.Itoa(code)))
	}
	unix.Sync()
	// reboot=t on the command line: a restart is a triple fault, which ends
	// qemu under -no-reboot. (Power-off would leave microvm halted.) On
	// arm64 a restart is PSCI SYSTEM_RESET, which ends qemu -M virt under
	// -no-reboot as well.
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		fmt.Fprintln(console, "outerinit: reboot:", err)
	}
	// PID 1 must not exit; wait for the reset.
	for {
		time.Sleep(time.Hour)
	}
}

func run(console *os.File, token *string) (int, error) {
	if err := mountBasics(); err != nil {
		return 0, err
	}
	data, err := os.ReadFile(job.Path)
	if err != nil {
		return 0, fmt.Errorf("reading the job: %w", err)
	}
	j, err := job.Decode(data)
	if err != nil {
		return 0, err
	}
	*token = j.Token
	fmt.Fprintln(console, job.Marker(job.MarkerInit, j.Token, "uptime="+uptime()))

	build := buildRoot
	if j.UserlandRoot {
		build = buildUserlandRoot
	}
	if err := build(); err != nil {
		return 0, err
	}
	if err := mountShares(j.Shares); err != nil {
		return 0, err
	}
	// A chdir that fails in the child is reported as "fork/exec <cmd>: no
	// such file or directory", which names the wrong thing: check first.
	if _, err := os.Stat(filepath.Join(newRoot, j.Dir)); err != nil {
		return 0, fmt.Errorf("the payload's working directory %s is not visible in the outer guest: %w", j.Dir, err)
	}
	if err := ensureKVMNode(filepath.Join(newRoot, "dev")); err != nil {
		// Not fatal: a payload that needs no KVM still runs; one that does
		// says so itself.
		fmt.Fprintln(console, "outerinit: warning:", err)
	}
	if err := loopbackUp(); err != nil {
		// Not fatal: only payloads that use 127.0.0.1 need it.
		fmt.Fprintln(console, "outerinit: warning:", err)
	}
	root := newRoot
	if j.UserlandRoot {
		if err := enterRoot(); err != nil {
			return 0, err
		}
		root = "/"
	}
	fmt.Fprintln(console, job.Marker(job.MarkerClock, j.Token, clocksource()))
	fmt.Fprintln(console, job.Marker(job.MarkerBegin, j.Token, ""))
	stopBeat := heartbeat(console, j.Token)
	code, err := runPayload(j, console, root)
	stopBeat()
	fmt.Fprintln(console, job.Marker(job.MarkerClock, j.Token, clocksource()))
	return code, err
}

// heartbeat prints MarkerAlive every job.AliveInterval until the returned
// stop is called (which waits for the last line to be written).
func heartbeat(console *os.File, token string) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(job.AliveInterval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				fmt.Fprintln(console, job.Marker(job.MarkerAlive, token, "uptime="+uptime()))
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// clocksource names the kernel's current clocksource, or why it cannot.
func clocksource() string {
	data, err := os.ReadFile(job.ClocksourcePath)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(data))
}

// loopbackUp brings lo up: payloads (the e2e egress tests, httptest
// servers) listen on 127.0.0.1, and no one else configures it here.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: reading its flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}

func mountBasics() error {
	mounts := []struct{ source, target, fstype, data string }{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", ""},
	}
	for _, m := range mounts {
		if err := mount(m.source, m.target, m.fstype, 0, m.data); err != nil {
			return err
		}
	}
	return nil
}

func mount(source, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", target, err)
	}
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", source, fstype, target, err)
	}
	return nil
}

// buildRoot assembles the payload's root at newRoot.
func buildRoot() error {
	if err := mount(job.HostRootTag, hostRoot, "9p", unix.MS_RDONLY, ninePOptions+",cache=loose"); err != nil {
		return fmt.Errorf("%w (is the outer kernel built with 9p and virtio-mmio?)", err)
	}
	if err := mount("tmpfs", newRoot, "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	entries, err := os.ReadDir(hostRoot)
	if err != nil {
		return fmt.Errorf("listing the host root: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if _, fresh := job.FreshDir(name); fresh || name == "lost+found" {
			continue
		}
		src, dst := filepath.Join(hostRoot, name), filepath.Join(newRoot, name)
		switch {
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return fmt.Errorf("host root: %w", err)
			}
			if err := os.Symlink(target, dst); err != nil {
				return fmt.Errorf("payload root: %w", err)
			}
		case e.IsDir():
			if err := mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return err
			}
		}
	}
	if err := mountFreshDirs(); err != nil {
		return err
	}
	// /var comes from the host read-only; programs expect /var/tmp writable.
	if _, err := os.Stat(filepath.Join(newRoot, "var/tmp")); err == nil {
		if err := mount("tmpfs", filepath.Join(newRoot, "var/tmp"), "tmpfs", 0, "mode=1777"); err != nil {
			return err
		}
	}
	return mountDevExtras()
}

// mountFreshDirs gives the payload's root its own proc, sys, dev, payload
// and tmpfs directories (job.FreshDir).
func mountFreshDirs() error {
	for _, name := range job.FreshDirNames() {
		kind, _ := job.FreshDir(name)
		dst := filepath.Join(newRoot, name)
		var err error
		switch kind {
		case "proc":
			err = mount("proc", dst, "proc", 0, "")
		case "sysfs":
			err = mount("sysfs", dst, "sysfs", 0, "")
		case "dev":
			err = mount("/dev", dst, "", unix.MS_BIND|unix.MS_REC, "")
		case "tmpfs":
			err = mount("tmpfs", dst, "tmpfs", 0, "mode=1777")
		case "payload":
			err = mount(job.PayloadTag, dst, "9p", 0, ninePOptions)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// mountDevExtras mounts dev/pts and dev/shm in the payload's root.
func mountDevExtras() error {
	for _, m := range []struct{ target, fstype, data string }{
		{"dev/pts", "devpts", "newinstance,ptmxmode=0666"},
		{"dev/shm", "tmpfs", "mode=1777"},
	} {
		if err := mount(m.fstype, filepath.Join(newRoot, m.target), m.fstype, 0, m.data); err != nil {
			return err
		}
	}
	return nil
}

// mountShares mounts the job's shared host directories read-only at their
// own paths in the payload's root (beneath a fresh tmpfs there).
func mountShares(shares []string) error {
	for i, dir := range shares {
		if err := mount(job.ShareTag(i), filepath.Join(newRoot, dir), "9p", unix.MS_RDONLY, ninePOptions); err != nil {
			return fmt.Errorf("sharing %s: %w", dir, err)
		}
	}
	return nil
}

// ensureKVMNode creates dev/kvm from sysfs when devtmpfs did not.
func ensureKVMNode(devDir string) error {
	node := filepath.Join(devDir, "kvm")
	if _, err := os.Stat(node); err == nil {
		return nil
	}
	numbers, err := os.ReadFile("/sys/class/misc/kvm/dev")
	if err != nil {
		return fmt.Errorf("no /dev/kvm and no /sys/class/misc/kvm (is KVM built into the outer kernel, with svm in the x86 qemu -cpu or virtualization=on on the arm64 virt machine?): %w", err)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(numbers)), "%d:%d", &major, &minor); err != nil {
		return fmt.Errorf("parsing /sys/class/misc/kvm/dev %q: %w", numbers, err)
	}
	if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		return fmt.Errorf("mknod %s: %w", node, err)
	}
	return nil
}

// enterRoot makes newRoot the root of outerinit's mount namespace, as
// switch_root does (move it onto /, chroot there), so the payload runs at
// the namespace's root rather than in a chroot: the kernel refuses a new
// user namespace (EPERM) to a process in a chroot, and the agent's
// isolated spawns and the process backend's sandbox need one. The
// userland root's outer guest gives up nothing by it: its initramfs holds
// only this program and the job, both read already.
func enterRoot() error {
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("entering the payload's root: %w", err)
	}
	if err := unix.Mount(newRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the payload's root onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("entering the payload's root: %w", err)
	}
	return unix.Chdir("/")
}

// runPayload runs the job's command in root (chrooted there unless root
// is already outerinit's own).
func runPayload(j job.Job, console *os.File, root string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), j.Timeout)
	defer cancel()
	path := j.Cmd[0]
	if !strings.Contains(path, "/") {
		resolved, err := lookPathIn(root, path)
		if err != nil {
			return 0, err
		}
		path = resolved
	}
	cmd := exec.CommandContext(ctx, path, j.Cmd[1:]...)
	cmd.Args[0] = j.Cmd[0]
	cmd.Dir = j.Dir
	cmd.Env = append([]string{
		"PATH=" + protocol.DefaultPath,
		"HOME=/root", "TMPDIR=/tmp", "TERM=dumb", "USER=root", "LANG=C.UTF-8",
	}, j.Env...)
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if root != "/" {
		cmd.SysProcAttr.Chroot = root
	}
	// On timeout kill the whole process group, not just the leader.
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		fmt.Fprintf(console, "outerinit: payload killed after its %v timeout\n", j.Timeout)
		return job.TimeoutExitCode, nil
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exitErr):
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return exitErr.ExitCode(), nil
	default:
		return 0, fmt.Errorf("running %q: %w", j.Cmd, err)
	}
}

// lookPathIn finds an executable in the payload root's PATH.
func lookPathIn(root, name string) (string, error) {
	for _, dir := range strings.Split(protocol.DefaultPath, ":") {
		p := filepath.Join(dir, name)
		if info, err := os.Stat(filepath.Join(root, p)); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("payload command %q not found in the guest's PATH", name)
}

func uptime() string {
	data, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return "unknown"
	}
	if fields := strings.Fields(string(data)); len(fields) > 0 {
		return fields[0]
	}
	return "unknown"
}
