//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/readahead"
	"github.com/cowork-vmm/cowork-vmm/guest/timerslack"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

// Where the guest mounts the two devices.
const (
	dataMountPoint = "/mnt"
	rootMountPoint = "/hostroot"
)

// fsMode reads the file-system benchmark mode from the kernel command line
// and, when it is on, mounts the devices, runs the workloads, printing one
// result line each on out, then the end marker. It reports whether the
// mode was on.
func fsMode(cmdline string, out io.Writer) bool {
	cfg, on, err := fsbench.ParseCmdline(cmdline)
	if !on {
		return false
	}
	// The workloads are system calls: without a slack the runtime's sysmon
	// would add a guest timer interrupt every 20 µs of them, which the
	// programs users run (cat, git) do not (package timerslack).
	if err := timerslack.Raise(timerslack.GuestTick); err != nil {
		fmt.Fprintln(out, "testinit: timer slack:", err)
	}
	defer fmt.Fprintln(out, fsbench.EndMarker)
	if err != nil {
		fmt.Fprintln(out, fsbench.Result{Workload: "config", Err: err.Error()}.Line())
		return true
	}
	env, err := mountShares(cfg)
	if err != nil {
		for _, w := range cfg.Workloads {
			fmt.Fprintln(out, fsbench.Result{Workload: w, Err: err.Error()}.Line())
		}
		return true
	}
	defer env.unmount()
	env.mark = func(metric string, begin bool) {
		fmt.Fprintln(out, fsbench.MarkLine(metric, begin))
		time.Sleep(fsbench.MarkPause) // the host samples meanwhile
	}
	env.mark.Mark(fsbench.MarkEmpty, true)
	env.mark.Mark(fsbench.MarkEmpty, false)
	for _, w := range fsbench.AllWorkloads {
		if cfg.Has(w) {
			fmt.Fprintln(out, env.run(w).Line())
		}
	}
	return true
}

// fsEnv is a mounted benchmark: the shared directory and the host's root
// as the guest sees them.
type fsEnv struct {
	cfg    fsbench.Config
	data   string // the shared directory; "" on a raw disk
	root   string // the host's root; "" without one
	mounts []string
	// seqFile is what seq writes and rand reads: a file in the shared
	// directory, or the raw disk itself.
	seqFile string
	// seqOK says the seq file was written and checked (rand reads it).
	seqOK bool
	// mark brackets each metric's timed work on the console.
	mark fsbench.MarkFunc
}

func mountShares(cfg fsbench.Config) (*fsEnv, error) {
	env := &fsEnv{cfg: cfg}
	if cfg.Data.Type == fsbench.TypeBlock {
		env.seqFile = "/dev/" + cfg.Data.Tag
		if err := waitForDevice(env.seqFile); err != nil {
			return nil, err
		}
		return env, nil
	}
	var err error
	if env.data, err = env.mount(cfg.Data, dataMountPoint, 0); err != nil {
		return nil, err
	}
	env.seqFile = filepath.Join(env.data, fsbench.FileName)
	if cfg.Root.Type != "" {
		if env.root, err = env.mount(cfg.Root, rootMountPoint, unix.MS_RDONLY); err != nil {
			env.unmount()
			return nil, err
		}
	}
	return env, nil
}

// deviceWait bounds waitForDevice; a variable for the tests.
var deviceWait = 2 * time.Second

// waitForDevice waits up to deviceWait for devtmpfs to show the block
// device at path (the kernel probes virtio devices before /init runs, but
// the node is made asynchronously).
func waitForDevice(path string) error {
	for deadline := time.Now().Add(deviceWait); ; time.Sleep(10 * time.Millisecond) {
		st, err := os.Stat(path)
		switch {
		case err == nil && st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0:
			return nil
		case err == nil:
			return fmt.Errorf("%s is not a block device (%s)", path, st.Mode())
		case time.Now().After(deadline):
			return fmt.Errorf("no disk: %w", err)
		}
	}
}

// mount mounts m at dir and returns the share's directory in it.
func (e *fsEnv) mount(m fsbench.Mount, dir string, flags uintptr) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := unix.Mount(m.Tag, dir, m.Type, flags, m.Options()); err != nil {
		return "", fmt.Errorf("mount -t %s -o %q %s %s: %w", m.Type, m.Options(), m.Tag, dir, err)
	}
	e.mounts = append(e.mounts, dir)
	if m.Type == fsbench.TypeVirtioFS {
		// As the agent does for its virtio-fs devices.
		if err := setReadAhead(dir); err != nil {
			return "", err
		}
	}
	share := filepath.Join(dir, m.Sub)
	if st, err := os.Stat(share); err != nil || !st.IsDir() {
		return "", fmt.Errorf("the %s share %s is not a directory (%v)", m.Type, share, err)
	}
	return share, nil
}

func (e *fsEnv) unmount() {
	for _, dir := range slices.Backward(e.mounts) {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
	e.mounts = nil
}

// run runs workload w and returns its result.
func (e *fsEnv) run(w string) fsbench.Result {
	var values map[string]int64
	var err error
	switch w {
	case fsbench.WorkloadSeq:
		values, err = seqWorkload(e.seqFile, e.cfg.MiB, e.mark)
		e.seqOK = err == nil
	case fsbench.WorkloadRand:
		if !e.seqOK {
			return fsbench.Result{Workload: w, Skip: "the seq workload did not write its file"}
		}
		values, err = randWorkload(e.seqFile, e.cfg.MiB, e.cfg.RandReads, e.mark)
	case fsbench.WorkloadWalk:
		values, err = walkWorkload(filepath.Join(e.data, fsbench.TreeDir), e.cfg.Dirs, e.cfg.FilesPerDir, e.mark)
	case fsbench.WorkloadGit:
		values, err = e.gitWorkload()
	case fsbench.WorkloadPython:
		values, err = e.pythonWorkload()
	default:
		err = fmt.Errorf("unknown workload %q", w)
	}
	var skip skipError
	switch {
	case errors.As(err, &skip):
		return fsbench.Result{Workload: w, Skip: skip.reason}
	case err != nil:
		return fsbench.Result{Workload: w, Err: err.Error()}
	}
	return fsbench.Result{Workload: w, Values: values}
}

// skipError says a workload cannot run here (not a failure).
type skipError struct{ reason string }

func (s skipError) Error() string { return s.reason }

// dropCaches writes back and drops the guest's page cache, dentries and
// inodes, so what follows reads through the device. A variable for the
// tests, which run unprivileged on the host.
var dropCaches = func() error {
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		return fmt.Errorf("dropping the page cache: %w", err)
	}
	return nil
}

// seqWorkload writes a file of mib blocks (one write() each, then fsync
// and close), drops the page cache, reads it back through a fresh
// descriptor (one read() a block) and checks every block, and that the
// file ends there. Only the I/O is timed. The file may be a raw disk of
// mib MiB (O_TRUNC leaves a device alone; its fsync is a cache flush).
func seqWorkload(path string, mib int, mark fsbench.MarkFunc) (map[string]int64, error) {
	block := make([]byte, fsbench.BlockSize)
	fsbench.FillPattern(block)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	mark.Mark("seq_write", true)
	start := time.Now()
	for i := range mib {
		fsbench.StampBlock(block, i)
		if _, err := f.Write(block); err != nil { // os.File.Write retries short writes
			f.Close()
			return nil, fmt.Errorf("writing block %d: %w", i, err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("close after writing: %w", err)
	}
	write := time.Since(start)
	mark.Mark("seq_write", false)
	if err := dropCaches(); err != nil {
		return nil, err
	}

	f, err = os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	got := make([]byte, fsbench.BlockSize)
	var read time.Duration
	mark.Mark("seq_read", true)
	for i := range mib {
		t := time.Now()
		_, err := io.ReadFull(f, got)
		read += time.Since(t)
		if err != nil {
			return nil, fmt.Errorf("reading block %d: %w", i, err)
		}
		fsbench.StampBlock(block, i)
		if !bytes.Equal(got, block) {
			return nil, fmt.Errorf("block %d read back differs from what was written", i)
		}
	}
	if n, err := f.Read(got[:1]); n != 0 || !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("the file is longer than the %d MiB written (read %d, %v)", mib, n, err)
	}
	mark.Mark("seq_read", false)
	ram, err := ramReadTime(mib)
	if err != nil {
		return nil, fmt.Errorf("the read from guest RAM: %w", err)
	}
	return map[string]int64{"bytes": int64(mib) * fsbench.BlockSize, "write_ns": write.Nanoseconds(), "read_ns": read.Nanoseconds(), "ram_read_ns": ram.Nanoseconds()}, nil
}

// ramReadTime writes mib blocks to a memfd and times reading them back
// as seqWorkload reads the shared file: one read() a block. A read of a
// file in RAM is one copy, from the page cache to the reader, which any
// read of a shared file makes too (virtio-fs with DAX included), so its
// rate bounds every system's sequential read in this guest.
func ramReadTime(mib int) (time.Duration, error) {
	fd, err := unix.MemfdCreate("fsbench-ram", unix.MFD_CLOEXEC)
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), "fsbench-ram")
	defer f.Close()
	block := make([]byte, fsbench.BlockSize)
	fsbench.FillPattern(block)
	for range mib {
		if _, err := f.Write(block); err != nil {
			return 0, err
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	var read time.Duration
	for i := range mib {
		t := time.Now()
		_, err := io.ReadFull(f, block)
		read += time.Since(t)
		if err != nil {
			return 0, fmt.Errorf("reading block %d: %w", i, err)
		}
	}
	return read, nil
}

// randWorkload drops the page cache and makes n reads of RandReadSize at
// aligned offsets of the seq file drawn from a fixed seed, each checked.
// Only the reads are timed.
func randWorkload(path string, mib, n int, mark fsbench.MarkFunc) (map[string]int64, error) {
	if err := dropCaches(); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(fsbench.RandSeed, fsbench.RandSeed))
	slots := int64(mib) * fsbench.BlockSize / fsbench.RandReadSize
	got := make([]byte, fsbench.RandReadSize)
	want := make([]byte, fsbench.RandReadSize)
	var total time.Duration
	mark.Mark("rand_read", true)
	for i := range n {
		off := rng.Int64N(slots) * fsbench.RandReadSize
		t := time.Now()
		_, err := f.ReadAt(got, off)
		total += time.Since(t)
		if err != nil {
			return nil, fmt.Errorf("read %d at %d: %w", i, off, err)
		}
		fsbench.ExpectedAt(want, off)
		if !bytes.Equal(got, want) {
			return nil, fmt.Errorf("read %d at %d differs from what was written", i, off)
		}
	}
	mark.Mark("rand_read", false)
	return map[string]int64{"reads": int64(n), "size": fsbench.RandReadSize, "ns": total.Nanoseconds()}, nil
}

// walkWorkload drops the page cache, walks the tree cold, then again warm,
// and checks it holds dirs directories of files each.
func walkWorkload(tree string, dirs, files int, mark fsbench.MarkFunc) (map[string]int64, error) {
	if err := dropCaches(); err != nil {
		return nil, err
	}
	var times [2]time.Duration
	for i, metric := range []string{"walk_cold", "walk_warm"} {
		mark.Mark(metric, true)
		start := time.Now()
		gotDirs, gotFiles, err := walkTree(tree)
		times[i] = time.Since(start)
		mark.Mark(metric, false)
		if err != nil {
			return nil, err
		}
		if gotDirs != dirs || gotFiles != dirs*files {
			return nil, fmt.Errorf("the tree holds %d directories and %d files, want %d and %d", gotDirs, gotFiles, dirs, dirs*files)
		}
	}
	return map[string]int64{"dirs": int64(dirs), "files": int64(dirs * files), "cold_ns": times[0].Nanoseconds(), "warm_ns": times[1].Nanoseconds()}, nil
}

// walkTree is what `git status` does to a work tree's files: it reads
// every directory (getdents) and lstats every entry, descending into the
// directories but not into .git. It returns the directories below root
// and the other entries.
func walkTree(root string) (dirs, files int, err error) {
	pending := []string{root}
	for len(pending) > 0 {
		dir := pending[len(pending)-1]
		pending = pending[:len(pending)-1]
		f, err := os.Open(dir)
		if err != nil {
			return dirs, files, err
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return dirs, files, fmt.Errorf("reading %s: %w", dir, err)
		}
		for _, name := range names {
			if name == ".git" {
				continue
			}
			path := dir + "/" + name
			var st unix.Stat_t
			if err := unix.Lstat(path, &st); err != nil {
				return dirs, files, fmt.Errorf("lstat %s: %w", path, err)
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				dirs++
				pending = append(pending, path)
			} else {
				files++
			}
		}
	}
	return dirs, files, nil
}

// gitWorkload binds the shared directory into the host's root and runs
// git status in the tree there, chrooted, cold and warm. The tree is
// clean, so git prints nothing; what it prints is counted as dirty.
func (e *fsEnv) gitWorkload() (map[string]int64, error) {
	if err := e.chrootReady(fsbench.GitPath); err != nil {
		return nil, err
	}
	target := filepath.Join(e.root, fsbench.GitMountPoint)
	if err := unix.Mount(e.data, target, "", unix.MS_BIND, ""); err != nil {
		return nil, skipError{fmt.Sprintf("binding the shared directory onto %s of the host's root: %v", fsbench.GitMountPoint, err)}
	}
	e.mounts = append(e.mounts, target)
	dir := filepath.Join(fsbench.GitMountPoint, fsbench.TreeDir)
	if err := dropCaches(); err != nil {
		return nil, err
	}
	values := map[string]int64{"files": int64(e.cfg.Dirs * e.cfg.FilesPerDir)}
	for _, key := range []string{"cold_ns", "warm_ns"} {
		metric := "git_" + strings.TrimSuffix(key, "_ns")
		e.mark.Mark(metric, true)
		d, out, err := e.chrooted(dir, fsbench.GitEnv, fsbench.GitPath, fsbench.GitArgs...)
		e.mark.Mark(metric, false)
		if err != nil {
			return nil, err
		}
		values[key] = d.Nanoseconds()
		values["dirty"] = int64(strings.Count(out, "\n"))
	}
	return values, nil
}

// pythonWorkload runs python3 -c 'import json' chrooted in the host's
// root: cold (page cache dropped), then the median of PythonWarmRuns warm
// runs.
func (e *fsEnv) pythonWorkload() (map[string]int64, error) {
	if err := e.chrootReady(fsbench.PythonPath); err != nil {
		return nil, err
	}
	if err := dropCaches(); err != nil {
		return nil, err
	}
	env := []string{"PATH=/usr/bin:/bin", "HOME=/", "LC_ALL=C"}
	e.mark.Mark("python_cold", true)
	cold, _, err := e.chrooted("/", env, fsbench.PythonPath, fsbench.PythonArgs...)
	e.mark.Mark("python_cold", false)
	if err != nil {
		return nil, err
	}
	warm := make([]time.Duration, fsbench.PythonWarmRuns)
	e.mark.Mark("python_warm", true) // every warm run: the host divides by warm_runs
	for i := range warm {
		if warm[i], _, err = e.chrooted("/", env, fsbench.PythonPath, fsbench.PythonArgs...); err != nil {
			return nil, err
		}
	}
	e.mark.Mark("python_warm", false)
	slices.Sort(warm)
	return map[string]int64{"cold_ns": cold.Nanoseconds(), "warm_ns": warm[len(warm)/2].Nanoseconds(), "warm_runs": int64(len(warm))}, nil
}

// chrootReady checks that the host's root is mounted and holds prog, and
// gives the chroot the guest's own /dev and /proc (the host's, seen through
// the share, cannot be opened as devices). Done once per boot.
func (e *fsEnv) chrootReady(prog string) error {
	if e.root == "" {
		return skipError{"no host root is shared"}
	}
	if _, err := os.Stat(filepath.Join(e.root, prog)); err != nil {
		return skipError{fmt.Sprintf("the host's root has no %s: %v", prog, err)}
	}
	for _, m := range []struct{ source, target, fstype string }{{"/dev", "dev", ""}, {"proc", "proc", "proc"}} {
		target := filepath.Join(e.root, m.target)
		if slices.Contains(e.mounts, target) {
			continue
		}
		flags := uintptr(0)
		if m.fstype == "" {
			flags = unix.MS_BIND
		}
		if err := unix.Mount(m.source, target, m.fstype, flags, ""); err != nil {
			return fmt.Errorf("mounting %s on %s for the chroot: %w", m.source, target, err)
		}
		e.mounts = append(e.mounts, target)
	}
	return nil
}

// chrooted runs prog with args chrooted in the host's root, in dir there,
// and returns the wall time from start to exit and its stdout; a failure
// (a non-zero exit) is an error with its stderr.
func (e *fsEnv) chrooted(dir string, env []string, prog string, args ...string) (time.Duration, string, error) {
	cmd := exec.Command(prog, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: e.root}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := timerslack.WithDefault(cmd.Run) // prog gets the default slack, as a user's would
	d := time.Since(start)
	if err != nil {
		return d, "", fmt.Errorf("%s %s in the host's root: %w: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(lastLine(stderr.String())))
	}
	return d, stdout.String(), nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// setReadAhead sets the read-ahead window of the file system mounted at
// dir to readahead.VirtioFSKiB.
func setReadAhead(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return readahead.Set(int(f.Fd()), readahead.VirtioFSKiB)
}
