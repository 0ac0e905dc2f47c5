//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/proxy/netns"
	"github.com/cowork-vmm/cowork-vmm/guest/timerslack"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/sdkturn"
)

// sdkLoader is the CLI's ELF interpreter: the host's root must hold it
// (and the C library) for the CLI to run chrooted there.
const sdkLoader = "/lib64/ld-linux-x86-64.so.2"

// sdkHomeDir is where the CLI's HOMEs go, in the host's root: a tmpfs the
// guest mounts over the (read-only) share's directory.
const sdkHomeDir = "/tmp"

// sdkMode runs the SDK turns when the kernel command line asks for them
// (package sdkturn): it brings the loopback up, serves the fake API on it,
// mounts the CLI's directory and the host's root, and runs the CLI from
// the one chrooted in the other, printing a line per turn, then the end
// marker. It reports whether the mode was on.
func sdkMode(cmdline string, out io.Writer) bool {
	cfg, on, err := sdkturn.ParseCmdline(cmdline)
	if !on {
		return false
	}
	// As in the fs mode: the runtime's sysmon would otherwise add timer
	// interrupts while init waits for the CLI (package timerslack).
	if err := timerslack.Raise(timerslack.GuestTick); err != nil {
		fmt.Fprintln(out, "testinit: timer slack:", err)
	}
	defer fmt.Fprintln(out, sdkturn.EndMarker)
	report := func(r fsbench.Result) { fmt.Fprintln(out, sdkturn.Line(r)) }
	if err == nil {
		var boot sdkturn.Boot
		var cleanup func()
		if boot, cleanup, err = sdkBoot(cfg); err == nil {
			defer cleanup()
			// Each turn's work is marked as the fs workloads' is: the
			// host samples its VMM's exits and CPU at the marks.
			boot.OnTurn = func(turn sdkturn.Turn, begin bool) {
				fmt.Fprintln(out, fsbench.MarkLine(sdkturn.WorkOp(turn), begin))
				time.Sleep(fsbench.MarkPause)
			}
			boot.Run(context.Background(), report)
			return true
		}
	}
	for _, turn := range sdkturn.Turns {
		report(fsbench.Result{Workload: turn.ID, Err: err.Error()})
	}
	return true
}

// sdkBoot readies the guest for the turns: the loopback and the fake API
// on it, the shares mounted, the chroot given the guest's /dev and /proc,
// the CLI's directory bound into it and a tmpfs for the HOMEs. cleanup
// undoes it.
func sdkBoot(cfg sdkturn.Config) (boot sdkturn.Boot, cleanup func(), err error) {
	if err := netns.LoopbackUp(); err != nil {
		return boot, nil, err
	}
	url, stop, err := sdkturn.Serve()
	if err != nil {
		return boot, nil, err
	}
	env, err := mountShares(fsbench.Config{Data: cfg.Data, Root: cfg.Root})
	if err != nil {
		stop()
		return boot, nil, err
	}
	cleanup = func() { env.unmount(); stop() }
	if err := existsInRoot(env.root, sdkLoader); err != nil {
		cleanup()
		return boot, nil, fmt.Errorf("the CLI cannot run chrooted in the host's root: %w", err)
	}
	// (chrootReady's own check, a stat from outside the root, would not
	// follow the loader's absolute symlink of a merged-/usr system.)
	if err := env.chrootReady("/"); err != nil {
		cleanup()
		return boot, nil, err
	}
	for _, m := range []struct{ source, target, fstype string }{
		{env.data, fsbench.GitMountPoint, ""},
		{"tmpfs", sdkHomeDir, "tmpfs"},
	} {
		target := filepath.Join(env.root, m.target)
		if st, err := os.Stat(target); err != nil || !st.IsDir() {
			cleanup()
			return boot, nil, fmt.Errorf("the host's root has no directory %s to mount on (%v)", m.target, err)
		}
		flags := uintptr(0)
		if m.fstype == "" {
			flags = unix.MS_BIND
		}
		if err := unix.Mount(m.source, target, m.fstype, flags, ""); err != nil {
			cleanup()
			return boot, nil, fmt.Errorf("mounting %s on %s of the host's root: %w", m.source, m.target, err)
		}
		env.mounts = append(env.mounts, target)
	}
	return sdkturn.Boot{
		Binary: filepath.Join(fsbench.GitMountPoint, cfg.Binary), Root: env.root, HomeDir: sdkHomeDir,
		APIURL: url, DropCaches: dropCaches, Start: timerslack.WithDefault,
	}, cleanup, nil
}

// existsInRoot checks that path exists in the tree at root as a process
// chrooted there sees it: symlinks, absolute ones included, resolve
// inside root.
func existsInRoot(root, path string) error {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return fmt.Errorf("%s in %s: %w", path, root, err)
	}
	return unix.Close(fd)
}
