// Package fsrun runs the file-system benchmark of the nested harness's
// test guest (package guestboot; fsbench is the guest's contract): FSBench
// boots the test guest once per system and run — our VMM with our
// virtio-fs or virtio-9p device, qemu microvm with its virtio-9p or with
// vhost-user-fs and virtiofsd — every system sharing the same directory
// and the same host root, and returns what testinit reported. The
// block-device systems boot it the same way with a raw disk image instead,
// a new sparse file each run in that directory, on our virtio-blk device or
// on qemu's. TestFSBench (run nested by testharness/nested's
// TestNestedFSBench) and package bench (`make bench`) both measure through
// it. It is a package of its own because it boots our VMM (package
// machine), whose tests use guestboot. Boot (mode.go) boots the same
// systems for the test guest's other modes (the SDK turns).
package fsrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/helper/backend/vm"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/vmm"
)

// Device tags and our devices' export names.
const (
	fsDataTag    = "fsdata"
	fsRootTag    = "fsroot"
	fsDataExport = "bench"
	fsRootExport = "root"
	// blkDisk is the raw disk's name in the guest's /dev (the first
	// virtio-blk device) and blkDrive qemu's -drive id for it.
	blkDisk  = "vda"
	blkDrive = "fsbenchdisk"
)

// FSBench runs the file-system benchmark: it boots the test guest, whose
// testinit runs the workloads (package fsbench), once per Run, on one
// system, every system sharing the same directory (Dir) and the same host
// root (Root); a block-device system gets the disk image in Dir instead.
type FSBench struct {
	// Kernel and Initrd are the test guest's (BuildInitramfs).
	Kernel, Initrd string
	// Dir is the shared directory, read-write; Prepare fills it. The
	// block-device systems' disk image is made there for each run.
	Dir string
	// Root is shared read-only for the git and python workloads (the
	// host's root, "/"); empty: they are left out.
	Root string
	// DataImmutable shares Dir on our VMM as the helper shares the SDK:
	// read-only, through the cached device (its pages stay in the guest
	// across opens), instead of as a session mount (uncached, writable).
	DataImmutable bool
	Sizes         guestboot.FSSizes
	// Workloads to run (default every one); Prepare leaves out those that
	// cannot run here.
	Workloads []string
	// MemMiB of the test guest (default 512).
	MemMiB int
	// Logger receives our VMM's log (nil: discarded).
	Logger *slog.Logger
	// Qemu is qemu-system-x86_64 (default: from PATH, unless NoQemu);
	// Virtiofsd is virtiofsd (default: FindVirtiofsd).
	Qemu, Virtiofsd string
	NoQemu          bool
	// GoMaxProcs, when above the Go default, is the GOMAXPROCS our VMM
	// runs with (0 or -1: the Go default, which is what the helper runs
	// with, so the default measures the product). Nested, on the harness's
	// one-CPU outer guest, a second P made every file-sharing request
	// slower, not faster: woken Ms and sysmon's 20 µs polls after each
	// KVM_RUN exit compete with the vCPU for the one CPU (same run, beside
	// qemu + virtiofsd: seq read 50–53 → 78 MB/s, python3 import warm
	// 1.7–2.8 → 1.1 s with one P).
	GoMaxProcs int
	// RunTimeout bounds one boot (default 3 min, plus 150 ms a tree file
	// and 2 s a MiB: what the slowest system takes nested, twice over).
	RunTimeout time.Duration
	// Console, when set, also receives every guest's serial console.
	Console io.Writer
	// OnMark, when set, is told each time the guest marks the beginning
	// or the end of a metric's timed work (fsbench.MarkLine), with the
	// pids of the host processes that serve the guest: this one for our
	// VMM (it runs in-process), qemu's and virtiofsd's. It is called from
	// the console's writer, so the guest's next console byte waits for it
	// (on our VMM; qemu's console is a pipe).
	OnMark func(m Mark)
}

// Mark is the guest's mark of the beginning or the end of a metric's timed
// work on System, and the pids of the processes that serve the guest.
type Mark struct {
	System, Metric string
	Begin          bool
	PIDs           []int
}

// FSRun is one boot's results.
type FSRun struct {
	System  string
	Run     int
	Results []fsbench.Result
	// Window is the wall time from testinit's ready line to its end line
	// and Busy the CPU time the machine running the VMM spent busy
	// meanwhile (/proc/stat, all CPUs): Window-Busy is time nothing ran.
	Window, Busy time.Duration
	// Exits are our VMM's exit counts over the window (zero for qemu).
	Exits vmm.Stats
}

// Figures returns r's results as figure lines' values.
func (r FSRun) Figures() []guestboot.FSFigure {
	out := make([]guestboot.FSFigure, 0, len(r.Results))
	for _, res := range r.Results {
		out = append(out, guestboot.FSFigure{System: r.System, Run: r.Run, Result: res})
	}
	return out
}

func (b *FSBench) withDefaults() {
	if len(b.Workloads) == 0 {
		b.Workloads = slices.Clone(fsbench.AllWorkloads)
	}
	if b.MemMiB == 0 {
		b.MemMiB = 512
	}
	if b.RunTimeout == 0 {
		b.RunTimeout = 3*time.Minute + time.Duration(b.Sizes.Dirs*b.Sizes.FilesPerDir)*150*time.Millisecond + time.Duration(b.Sizes.MiB)*2*time.Second
	}
	if b.Logger == nil {
		b.Logger = slog.New(slog.DiscardHandler)
	}
	if b.Qemu == "" && !b.NoQemu {
		b.Qemu, _ = exec.LookPath("qemu-system-x86_64")
	}
	if b.Virtiofsd == "" {
		b.Virtiofsd = FindVirtiofsd()
	}
}

// Prepare makes the tree in Dir (and commits it as a git repository for
// the git workload) and leaves out the workloads that cannot run here,
// returning a note for each.
func (b *FSBench) Prepare(ctx context.Context) (notes []string, err error) {
	b.withDefaults()
	drop := func(w, why string) {
		if i := slices.Index(b.Workloads, w); i >= 0 {
			b.Workloads = slices.Delete(b.Workloads, i, i+1)
			notes = append(notes, fmt.Sprintf("no %s workload: %s", w, why))
		}
	}
	if b.Root == "" {
		drop(fsbench.WorkloadGit, "no host root is shared")
		drop(fsbench.WorkloadPython, "no host root is shared")
	} else if !isFile(filepath.Join(b.Root, fsbench.PythonPath)) {
		drop(fsbench.WorkloadPython, "the host has no "+fsbench.PythonPath)
	}
	// (The block-device systems run a subset of these workloads.)
	if err := b.config(guestboot.FSOursVirtioFS).Validate(); err != nil {
		return notes, err
	}
	if !slices.Contains(b.Workloads, fsbench.WorkloadWalk) && !slices.Contains(b.Workloads, fsbench.WorkloadGit) {
		return notes, nil // no tree to make
	}
	if err := guestboot.MakeTree(filepath.Join(b.Dir, fsbench.TreeDir), b.Sizes.Dirs, b.Sizes.FilesPerDir); err != nil {
		return notes, err
	}
	if slices.Contains(b.Workloads, fsbench.WorkloadGit) {
		if why := gitUnavailable(b.Root); why != "" {
			drop(fsbench.WorkloadGit, why)
		} else if err := commitTree(ctx, filepath.Join(b.Dir, fsbench.TreeDir)); err != nil {
			drop(fsbench.WorkloadGit, err.Error())
		}
	}
	return notes, nil
}

// gitUnavailable says why the git workload cannot run with root, or "".
func gitUnavailable(root string) string {
	if !isFile(filepath.Join(root, fsbench.GitPath)) {
		return "the host has no " + fsbench.GitPath
	}
	if st, err := os.Stat(filepath.Join(root, fsbench.GitMountPoint)); err != nil || !st.IsDir() {
		return "the host's root has no directory " + fsbench.GitMountPoint + " to bind the shared directory on"
	}
	if _, err := exec.LookPath("git"); err != nil {
		return "no git on PATH to commit the tree"
	}
	return ""
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// commitTree makes dir a git repository with every file committed.
func commitTree(ctx context.Context, dir string) error {
	for _, args := range [][]string{
		{"init", "-q"},
		{"add", "-A"},
		{"-c", "user.name=fsbench", "-c", "user.email=fsbench@localhost", "commit", "-q", "-m", "tree"},
	} {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "LC_ALL=C")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s in the tree: %w: %s", args[0], err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// Unavailable says why system cannot run here, or "". (Our VMM's systems
// need a KVM that boots Linux, which the caller has checked.)
func (b *FSBench) Unavailable(system string) string {
	b.withDefaults()
	if guestboot.IsBlk(system) && len(b.config(system).Workloads) == 0 {
		return "none of the workloads selected (" + strings.Join(b.Workloads, ",") + ") runs on a raw disk"
	}
	switch system {
	case guestboot.FSOursVirtioFS, guestboot.FSOursNineP, guestboot.FSOursBlk:
		return ""
	case guestboot.FSQemuNineP, guestboot.FSQemuBlk:
		return b.noQemu()
	case guestboot.FSQemuVirtiofsd:
		if why := b.noQemu(); why != "" {
			return why
		}
		if b.Virtiofsd == "" {
			return "no virtiofsd (looked for virtiofsd on PATH, " + strings.Join(virtiofsdPaths, ", ") + ")"
		}
		return ""
	}
	return "unknown system " + strconv.Quote(system)
}

func (b *FSBench) noQemu() string {
	switch {
	case b.NoQemu:
		return "no qemu peer here"
	case b.Qemu == "":
		return "no qemu-system-x86_64"
	}
	return ""
}

// virtiofsdPaths are where Debian installs virtiofsd: the virtiofsd
// package (Rust) and qemu-system-common up to qemu 7.2 (the C daemon).
var virtiofsdPaths = []string{"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"}

// FindVirtiofsd returns a virtiofsd, or "".
func FindVirtiofsd() string {
	if p, err := exec.LookPath("virtiofsd"); err == nil {
		return p
	}
	for _, p := range virtiofsdPaths {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// config is the guest's configuration on system.
func (b *FSBench) config(system string) fsbench.Config {
	c := fsbench.Config{Workloads: b.Workloads, MiB: b.Sizes.MiB, RandReads: b.Sizes.RandReads, Dirs: b.Sizes.Dirs, FilesPerDir: b.Sizes.FilesPerDir}
	if guestboot.IsBlk(system) {
		c.Workloads = slices.DeleteFunc(slices.Clone(c.Workloads), func(w string) bool { return !slices.Contains(fsbench.BlockWorkloads, w) })
		c.Data = fsbench.Mount{Type: fsbench.TypeBlock, Tag: blkDisk}
		return c
	}
	// The data share is uncached (what the helper's session mounts are);
	// the root is cached (the helper's read-only system directories).
	switch system {
	case guestboot.FSOursVirtioFS:
		c.Data = fsbench.Mount{Type: fsbench.TypeVirtioFS, Tag: fsDataTag, Sub: fsDataExport}
		c.Root = fsbench.Mount{Type: fsbench.TypeVirtioFS, Tag: fsRootTag, Sub: fsRootExport}
	case guestboot.FSOursNineP:
		c.Data = fsbench.Mount{Type: fsbench.TypeNineP, Tag: fsDataTag, Aname: fsDataExport}
		c.Root = fsbench.Mount{Type: fsbench.TypeNineP, Tag: fsRootTag, Aname: fsRootExport, Cache: "loose"}
	case guestboot.FSQemuNineP:
		c.Data = fsbench.Mount{Type: fsbench.TypeNineP, Tag: fsDataTag}
		c.Root = fsbench.Mount{Type: fsbench.TypeNineP, Tag: fsRootTag, Cache: "loose"}
	case guestboot.FSQemuVirtiofsd:
		c.Data = fsbench.Mount{Type: fsbench.TypeVirtioFS, Tag: fsDataTag}
		c.Root = fsbench.Mount{Type: fsbench.TypeVirtioFS, Tag: fsRootTag}
	}
	if b.Root == "" {
		c.Root = fsbench.Mount{}
	}
	return c
}

// Run boots the test guest once on system, lets it run the workloads and
// returns what it reported. An error means the guest did not boot or
// finish: the results are those of the workloads it finished (none, or
// some); a workload that failed is a Result with Err. It checks
// the seq file the guest wrote and removes it; for a block-device system
// that file is the disk image, made here, sparse, of the seq file's size.
func (b *FSBench) Run(ctx context.Context, system string, run int) (FSRun, error) {
	b.withDefaults()
	if why := b.Unavailable(system); why != "" {
		return FSRun{}, errors.New(why)
	}
	ctx, cancel := context.WithTimeout(ctx, b.RunTimeout)
	defer cancel()
	cfg := b.config(system)
	seqFile := filepath.Join(b.Dir, fsbench.FileName)
	defer os.Remove(seqFile)
	if guestboot.IsBlk(system) {
		if err := makeImage(seqFile, b.Sizes.MiB); err != nil {
			return FSRun{}, err
		}
	}
	window := &busyWindow{end: fsbench.EndMarker}
	console, err := b.boot(ctx, system, cfg.Cmdline(), window)
	res := FSRun{System: system, Run: run}
	res.Window, res.Busy = window.result()
	res.Exits = window.exits()
	results, parseErr := guestboot.FSResults(console)
	if parseErr != nil {
		if err == nil {
			err = parseErr
		}
		// What the guest finished before it failed (a guest that did not
		// end in time) is still measured.
		res.Results = results
		return res, fmt.Errorf("%s: %w; console:\n%s", system, err, guestboot.TailLines(console, 40))
	}
	res.Results = results
	for i, r := range res.Results {
		if r.Workload == fsbench.WorkloadSeq && r.Err == "" {
			if err := guestboot.CheckSeqFile(seqFile, b.Sizes.MiB); err != nil {
				res.Results[i] = fsbench.Result{Workload: r.Workload, Err: "the host's copy of the file: " + err.Error()}
			}
		}
	}
	return res, nil
}

// boot boots the test guest once on system with these kernel command
// line words and returns its console.
func (b *FSBench) boot(ctx context.Context, system, cmdline string, window *busyWindow) (string, error) {
	switch system {
	case guestboot.FSOursVirtioFS, guestboot.FSOursNineP, guestboot.FSOursBlk:
		if prev := runtime.GOMAXPROCS(0); b.GoMaxProcs > prev {
			runtime.GOMAXPROCS(b.GoMaxProcs)
			defer runtime.GOMAXPROCS(prev)
		}
		return b.runOurs(ctx, system, cmdline, window)
	}
	return b.runQemu(ctx, system, cmdline, window)
}

// makeImage creates path afresh as a sparse file of mib MiB.
func makeImage(path string, mib int) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("the disk image: %w", err)
	}
	err = f.Truncate(int64(mib) * fsbench.BlockSize)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("the disk image: %w", err)
	}
	return nil
}

// runOurs boots the test guest on our VMM with the data and root devices
// of system, or its disk, and the kernel command line words cmdline, and
// returns its console.
func (b *FSBench) runOurs(ctx context.Context, system, cmdline string, window *busyWindow) (string, error) {
	var devices []virtio.Device
	if system == guestboot.FSOursBlk {
		f, err := os.OpenFile(filepath.Join(b.Dir, fsbench.FileName), os.O_RDWR, 0)
		if err != nil {
			return "", fmt.Errorf("the disk image: %w", err)
		}
		defer f.Close() // after the machine's Stop, whose reset is the device's last
		dev, err := blk.New(f, blk.Options{Serial: "fsbench", Logger: b.Logger})
		if err != nil {
			return "", err
		}
		devices = append(devices, dev)
	}
	type share struct {
		export, dir string
		readOnly    bool
		tag         string
		cached      bool
	}
	var shares []share
	if !guestboot.IsBlk(system) {
		shares = append(shares, share{fsDataExport, b.Dir, b.DataImmutable, fsDataTag, b.DataImmutable})
		if b.Root != "" {
			shares = append(shares, share{fsRootExport, b.Root, true, fsRootTag, true})
		}
	}
	// As the kvm backend does: a descriptor per looked-up file, every
	// device's out of one pool under the raised limit.
	limit, err := fdlimit.Raise()
	if err != nil {
		return "", err
	}
	descriptors := fdlimit.NewPool(limit)
	kind := protocol.MountKindNineP
	if system == guestboot.FSOursVirtioFS {
		kind = protocol.MountKindVirtioFS
	}
	for _, s := range shares {
		share, dev, err := vm.NewShareDevice(kind, s.tag, s.cached, descriptors.Share(0), b.Logger)
		if err != nil {
			return "", err
		}
		defer share.Close() // after the machine's Stop: its reset's requests are answered
		if err := share.Exports().Add(s.export, s.dir, s.readOnly); err != nil {
			return "", err
		}
		devices = append(devices, dev)
	}
	watch := guestboot.NewConsoleWatcher(time.Now())
	sinks := []io.Writer{watch, window}
	if b.Console != nil {
		sinks = append(sinks, b.Console)
	}
	if b.OnMark != nil {
		marks := &markSink{system: system, onMark: b.OnMark}
		marks.setPIDs(os.Getpid())
		sinks = append(sinks, marks)
	}
	m, err := machine.New(machine.Config{
		Kernel: b.Kernel, Initrd: b.Initrd, CPUs: 1, MemMiB: b.MemMiB,
		Console: io.MultiWriter(sinks...), Logger: b.Logger, Cmdline: cmdline,
	})
	if err != nil {
		return "", err
	}
	window.vmStats = m.VM().Stats // before Start: the console is quiet until then
	defer m.Stop()                //nolint:errcheck // the explicit Stop below reports
	for _, dev := range devices {
		if _, err := m.AddVirtioMMIO(dev); err != nil {
			return "", err
		}
	}
	if err := m.Start(); err != nil {
		return "", err
	}
	select {
	case <-m.Done():
	case <-ctx.Done():
		return watch.Console(), fmt.Errorf("the guest did not end within %v", b.RunTimeout)
	}
	exit := m.Wait()
	if _, err := m.Stop(); err != nil {
		return watch.Console(), err
	}
	if !exit.Clean() {
		return watch.Console(), fmt.Errorf("the VM ended with %v", exit)
	}
	return watch.Console(), nil
}

// runQemu boots the test guest on qemu microvm with system's devices and
// returns its console.
func (b *FSBench) runQemu(ctx context.Context, system, cmdline string, window *busyWindow) (string, error) {
	o := guestboot.QemuOptions{
		Machine: guestboot.QemuNineMachine, Kernel: b.Kernel, Initrd: b.Initrd, CPUs: 1, MemMiB: b.MemMiB,
		Append: cmdline, Qemu: b.Qemu,
	}
	shares := [][2]string{{fsDataTag, b.Dir}}
	if b.Root != "" {
		shares = append(shares, [2]string{fsRootTag, b.Root})
	}
	var daemons []*virtiofsd
	switch system {
	case guestboot.FSQemuBlk:
		args, err := guestboot.QemuBlkArgs(filepath.Join(b.Dir, fsbench.FileName), blkDrive)
		if err != nil {
			return "", err
		}
		o.Args = append(o.Args, args...)
	case guestboot.FSQemuNineP:
		for i, s := range shares {
			args, err := guestboot.QemuNinePArgs(s[1], s[0], i > 0)
			if err != nil {
				return "", err
			}
			o.Args = append(o.Args, args...)
		}
	case guestboot.FSQemuVirtiofsd:
		work, err := os.MkdirTemp("", "fsbench-virtiofsd-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(work)
		// vhost-user: the guest's memory must be shared with virtiofsd,
		// and libvhost-user serves only modern (virtio 1) devices, which
		// microvm's virtio-mmio is not by default.
		o.Machine += ",memory-backend=fsbenchmem"
		o.Args = append(o.Args, "-global", "virtio-mmio.force-legacy=false")
		o.Args = append(o.Args, "-object", fmt.Sprintf("memory-backend-memfd,id=fsbenchmem,size=%dM,share=on", b.MemMiB))
		for i, s := range shares {
			sock := filepath.Join(work, s[0]+".sock")
			cache := "auto" // virtiofsd's default: close-to-open, 1 s lifetimes
			if i > 0 {
				cache = "always" // the read-only root
			}
			d, err := startVirtiofsd(ctx, b.Virtiofsd, sock, s[1], cache)
			if err != nil {
				return "", fmt.Errorf("%w: %w", errSystemUnavailable, err)
			}
			defer d.stop()
			daemons = append(daemons, d)
			o.Args = append(o.Args, "-chardev", "socket,id="+s[0]+",path="+sock,
				"-device", "vhost-user-fs-device,chardev="+s[0]+",tag="+s[0])
		}
	}
	console := guestboot.NewConsoleWatcher(time.Now())
	sinks := []io.Writer{console, window}
	if b.Console != nil {
		sinks = append(sinks, b.Console)
	}
	if b.OnMark != nil {
		marks := &markSink{system: system, onMark: b.OnMark}
		o.OnStart = func(pid int) {
			pids := []int{pid}
			for _, d := range daemons {
				pids = append(pids, d.cmd.Process.Pid)
			}
			marks.setPIDs(pids...)
		}
		sinks = append(sinks, marks)
	}
	o.Console = io.MultiWriter(sinks...)
	_, err := guestboot.QemuMicrovmWith(ctx, o)
	if err != nil {
		for _, d := range daemons {
			if msg := strings.TrimSpace(d.stderr.String()); msg != "" {
				err = fmt.Errorf("%w; virtiofsd for %s: %s", err, d.dir, guestboot.TailLines(msg, 5))
			}
		}
	}
	return console.Console(), err
}

// errSystemUnavailable marks a run that could not start its system's
// daemons (virtiofsd): the system cannot run here, which is no failure of
// the guest's file systems.
var errSystemUnavailable = errors.New("the system cannot run here")

// IsUnavailable says whether err is a Run's report that its system cannot
// run here.
func IsUnavailable(err error) bool { return errors.Is(err, errSystemUnavailable) }

// virtiofsd is a running virtiofsd.
type virtiofsd struct {
	dir    string
	cmd    *exec.Cmd
	stderr *lockedBuffer
	done   chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startVirtiofsd starts virtiofsd serving dir on a vhost-user socket at
// sock and waits until it listens. Both daemons' command lines are known:
// the Rust one (--shared-dir) and qemu's C one (-o source=). Its sandbox
// is a chroot: the namespace sandbox's pivot_root fails for the harness's
// root (a chroot of the outer guest's initramfs), and the sandbox does not
// change what a request costs.
func startVirtiofsd(ctx context.Context, bin, sock, dir, cache string) (*virtiofsd, error) {
	help, _ := exec.CommandContext(ctx, bin, "--help").CombinedOutput()
	var args []string
	if bytes.Contains(help, []byte("--shared-dir")) {
		args = []string{"--socket-path=" + sock, "--shared-dir=" + dir, "--cache=" + cache, "--sandbox=chroot"}
	} else {
		args = []string{"--socket-path=" + sock, "-o", "source=" + dir, "-o", "cache=" + cache, "-o", "sandbox=chroot"}
	}
	d := &virtiofsd{cmd: exec.Command(bin, args...), stderr: &lockedBuffer{}, done: make(chan struct{}), dir: dir}
	d.cmd.Stdout, d.cmd.Stderr = d.stderr, d.stderr
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	deadline := time.After(20 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return d, nil
		}
		select {
		case <-d.done:
			return nil, fmt.Errorf("%s %s exited before listening (%v): %s", bin, strings.Join(args, " "), d.cmd.ProcessState, strings.TrimSpace(d.stderr.String()))
		case <-deadline:
			d.stop()
			return nil, fmt.Errorf("%s did not listen on %s within 20 s: %s", bin, sock, strings.TrimSpace(d.stderr.String()))
		case <-ctx.Done():
			d.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends virtiofsd (it exits by itself when qemu closes the socket).
func (d *virtiofsd) stop() {
	select {
	case <-d.done:
		return
	case <-time.After(2 * time.Second):
	}
	_ = d.cmd.Process.Kill()
	<-d.done
}

// markSink is a console sink that calls onMark for each of the guest's
// mark lines.
type markSink struct {
	system string
	onMark func(Mark)

	mu   sync.Mutex
	line consoleLine
	pids []int
}

func (s *markSink) setPIDs(pids ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pids = pids
}

func (s *markSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.line.feed(p, func(line string) {
		metric, begin, ok := fsbench.ParseMark(line)
		if ok && len(s.pids) > 0 {
			s.onMark(Mark{System: s.system, Metric: metric, Begin: begin, PIDs: slices.Clone(s.pids)})
		}
	})
	return len(p), nil
}

// maxConsoleLine is how much of one console line the sinks keep: every
// line they look for is short; the rest of a longer one is dropped.
const maxConsoleLine = 4096

// consoleLine is a console sink's line in progress.
type consoleLine []byte

// feed adds p to the line and calls onLine with each line it completes.
func (l *consoleLine) feed(p []byte, onLine func(string)) {
	for _, c := range p {
		if c != '\n' {
			if len(*l) < maxConsoleLine {
				*l = append(*l, c)
			}
			continue
		}
		line := string(*l)
		*l = (*l)[:0]
		onLine(line)
	}
}

// busyWindow is a console sink that notes the wall time and this
// machine's busy CPU time (/proc/stat) at testinit's ready line and at its
// end line. Console writers may be called from several goroutines.
type busyWindow struct {
	// end is the line that closes the window.
	end string
	// vmStats, when set, is sampled at both lines too (our VMM's exits).
	vmStats func() vmm.Stats

	mu         sync.Mutex
	line       consoleLine
	startWall  time.Time
	startBusy  time.Duration
	wall, busy time.Duration
	startStats vmm.Stats
	stats      vmm.Stats // the difference
}

func (w *busyWindow) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.line.feed(p, func(line string) {
		switch {
		case strings.Contains(line, guestboot.ReadyMarker) && w.startWall.IsZero():
			w.startWall, w.startBusy = time.Now(), machineBusy()
			if w.vmStats != nil {
				w.startStats = w.vmStats()
			}
		case strings.Contains(line, w.end) && !w.startWall.IsZero() && w.wall == 0:
			w.wall, w.busy = time.Since(w.startWall), machineBusy()-w.startBusy
			if w.vmStats != nil {
				end := w.vmStats()
				w.stats = vmm.Stats{Runs: end.Runs - w.startStats.Runs, IOExits: end.IOExits - w.startStats.IOExits,
					MMIOExits: end.MMIOExits - w.startStats.MMIOExits, Interrupted: end.Interrupted - w.startStats.Interrupted}
			}
		}
	})
	return len(p), nil
}

// exits returns the vmStats difference between the two lines.
func (w *busyWindow) exits() vmm.Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

func (w *busyWindow) result() (wall, busy time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wall, w.busy
}

// machineBusy is the CPU time all CPUs spent not idle since boot (the
// "cpu" line of /proc/stat, in USER_HZ ticks, less idle and iowait); 0 if
// unreadable.
func machineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(first)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, f := range fields[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0
		}
		// user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is already counted in user.
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / userHZ
}

// userHZ is the unit of /proc/stat: USER_HZ, 100 on every Linux ABI.
const userHZ = 100

// EnvFSGoMaxProcs, when set, is TestFSBench's FSBench.GoMaxProcs (e.g. 2,
// to see what a second P costs on a one-CPU machine).
const EnvFSGoMaxProcs = "GUESTBOOT_FS_GOMAXPROCS"

// EnvFSSystems, when set, names the systems TestFSBench measures (comma
// separated, guestboot.FSSystems' names); the others are left out, for a
// quicker look at one of them.
const EnvFSSystems = "GUESTBOOT_FS_SYSTEMS"

// Selected says whether EnvFSSystems leaves system in (unset: all are).
func Selected(system string) bool {
	only := os.Getenv(EnvFSSystems)
	return only == "" || slices.Contains(strings.Split(only, ","), system)
}
