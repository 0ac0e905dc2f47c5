package bench

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Work accounting: what a VMM makes the host do for an operation, in units
// that barely depend on how fast the host runs (every time measured in the
// nested harness is the emulator's): KVM exits by reason, from the kernel's
// debugfs (/sys/kernel/debug/kvm/<pid>-<fd>/, one directory per VM, each
// file a counter summed over the VM's vCPUs), and the host CPU time (user +
// system) of the VMM's processes, from /proc/<pid>/stat. debugfs serves
// every VMM alike (qemu's counters included, which only qemu could read
// through KVM_GET_STATS_FD), so ours and the peers are counted the same way.
//
// A WorkMeter samples a set of processes (WorkSample); Sub of two samples
// is the Work done between them.

// ExitCounter is one of the debugfs counters the work accounting reads.
type ExitCounter struct {
	Name string // the debugfs file
	// Scales says what the counter grows with: ScalesWork (the guest's
	// I/O, MMIO, page faults, emulation: what an operation asks of the
	// VMM) or ScalesWall (timers, halts, interrupt windows: how long the
	// operation took, on whatever clock the host runs), or ScalesTotal.
	Scales string
	// IODriven: the guest's I/O the VMM serves in user space (port I/O and
	// MMIO exits), the figure issue #42's exit targets judge.
	IODriven bool
}

// What counters scale with.
const (
	ScalesTotal = "total"
	ScalesWork  = "work"
	ScalesWall  = "wall time"
)

// ExitCounters are the counters read on this host's architecture, in
// report order (ExitCountersFor).
var ExitCounters = ExitCountersFor(runtime.GOARCH)

// ExitCountersFor is the counter list of a GOARCH's KVM: arm64's names
// differ from x86's.
func ExitCountersFor(goarch string) []ExitCounter {
	if goarch == "arm64" {
		return arm64ExitCounters
	}
	return amd64ExitCounters
}

// amd64ExitCounters: Linux 6.1's x86 KVM: io_exits and mmio_exits count
// exits to the VMM in user space (a kick an ioeventfd catches stays in the
// kernel: it shows in exits and pf_taken or insn_emulation, not there); irq_exits are host interrupts
// (the host's timer among them), halt_exits the guest idling,
// irq_window_exits waits to inject an interrupt.
var amd64ExitCounters = []ExitCounter{
	{Name: "exits", Scales: ScalesTotal},
	{Name: "io_exits", Scales: ScalesWork, IODriven: true},
	{Name: "mmio_exits", Scales: ScalesWork, IODriven: true},
	{Name: "pf_taken", Scales: ScalesWork},
	{Name: "pf_fixed", Scales: ScalesWork},
	{Name: "insn_emulation", Scales: ScalesWork},
	{Name: "hypercalls", Scales: ScalesWork},
	{Name: "halt_exits", Scales: ScalesWall},
	{Name: "halt_wakeup", Scales: ScalesWall},
	{Name: "irq_exits", Scales: ScalesWall},
	{Name: "irq_window_exits", Scales: ScalesWall},
	{Name: "nmi_window_exits", Scales: ScalesWall},
	{Name: "request_irq_exits", Scales: ScalesWall},
	{Name: "signal_exits", Scales: ScalesWall},
	{Name: "irq_injections", Scales: ScalesWall},
}

// arm64ExitCounters: Linux 6.1's arm64 KVM (arch/arm64/kvm/guest.c):
// mmio_exit_user counts MMIO exits to the VMM in user space (there is no
// port I/O), mmio_exit_kernel MMIO KVM served itself (the in-kernel GIC's
// distributor and redistributors, ioeventfds), hvc_exit_stat hypercalls
// (PSCI), wfi_exit_stat and wfe_exit_stat the guest idling or spinning,
// halt_wakeup its wake-ups; host interrupts have no counter of their own
// (they are in exits).
var arm64ExitCounters = []ExitCounter{
	{Name: "exits", Scales: ScalesTotal},
	{Name: "mmio_exit_user", Scales: ScalesWork, IODriven: true},
	{Name: "mmio_exit_kernel", Scales: ScalesWork},
	{Name: "hvc_exit_stat", Scales: ScalesWork},
	{Name: "wfi_exit_stat", Scales: ScalesWall},
	{Name: "wfe_exit_stat", Scales: ScalesWall},
	{Name: "halt_wakeup", Scales: ScalesWall},
	{Name: "signal_exits", Scales: ScalesWall},
}

// IOExitsKey is the name under which Work and the report give io_exits +
// mmio_exits (the ExitCounters marked IODriven; mmio_exit_user on arm64).
const IOExitsKey = "io+mmio"

// Where the counters live, and the unit of /proc/PID/stat's times.
const (
	DebugfsRoot = "/sys/kernel/debug"
	kvmDebugfs  = "kvm"
	procRoot    = "/proc"
	kvmVMLink   = "anon_inode:kvm-vm"
	// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100
	// on every Linux ABI, so a CPU time has a 10 ms resolution.
	clockTicks = 100
	// maxCounter bounds a counter file's size (a number and a newline).
	maxCounter = 64
)

// WorkMeter samples the work of sets of processes. The zero value reads
// the real /proc and debugfs; tests point it at fixtures.
type WorkMeter struct {
	// Proc is procfs's mount point (default /proc), Debugfs debugfs's
	// (default /sys/kernel/debug).
	Proc, Debugfs string
}

// WorkSample is one reading of a set of processes' counters.
type WorkSample struct {
	At time.Time
	// Exits are the KVM counters (ExitCounters' names) summed over the
	// processes' VMs; VMs how many VMs were found (0 before a VMM has made
	// one). ExitsErr says why exits are not measured ("" when they are).
	Exits    map[string]uint64
	VMs      int
	ExitsErr string
	// CPU is the processes' user + system time, their live descendants'
	// and their reaped children's (cutime, cstime). GuestCPU is the part
	// of it their vCPU threads spent running the guest (guest_time: Linux
	// counts it as user time too). CPUErr says why they are not measured.
	CPU      time.Duration
	GuestCPU time.Duration
	CPUErr   string
}

// Work is what a set of processes did between two samples.
type Work struct {
	Wall time.Duration
	// Exits by counter name, plus IOExitsKey; nil when ExitsErr says why
	// they were not measured.
	Exits    map[string]int64
	ExitsErr string
	CPU      time.Duration
	GuestCPU time.Duration // the part of CPU spent running the guest
	CPUErr   string
}

func (m WorkMeter) proc() string    { return cmp.Or(m.Proc, procRoot) }
func (m WorkMeter) debugfs() string { return cmp.Or(m.Debugfs, DebugfsRoot) }

// Sample reads the counters of pids (and their descendants' CPU time). A
// process that no longer exists counts nothing; a counter that cannot be
// read makes the sample say why instead of counting zero.
func (m WorkMeter) Sample(pids ...int) WorkSample {
	s := WorkSample{At: time.Now()}
	s.Exits, s.VMs, s.ExitsErr = m.exits(pids)
	s.readCPU(m, pids)
	return s
}

func (s *WorkSample) readCPU(m WorkMeter, pids []int) {
	cpu, guest, err := m.cpu(pids)
	if err != nil {
		s.CPUErr = err.Error()
	}
	s.CPU, s.GuestCPU = cpu, guest
}

// SampleCPUFirst is Sample reading the CPU times before the exits: the
// end of a window, so that reading debugfs costs the window nothing (a
// window's start reads the CPU times last, with Sample).
func (m WorkMeter) SampleCPUFirst(pids ...int) WorkSample {
	s := WorkSample{At: time.Now()}
	s.readCPU(m, pids)
	s.Exits, s.VMs, s.ExitsErr = m.exits(pids)
	return s
}

// Sub returns the work done from earlier to s. Exits are not measured when
// either sample lacks them, when s found no VM, or when a counter went
// backwards (a VM ended between the two).
func (s WorkSample) Sub(earlier WorkSample) Work {
	w := Work{Wall: s.At.Sub(earlier.At), CPU: s.CPU - earlier.CPU, GuestCPU: s.GuestCPU - earlier.GuestCPU, CPUErr: cmp.Or(s.CPUErr, earlier.CPUErr)}
	if w.CPUErr == "" && (w.CPU < 0 || w.GuestCPU < 0) {
		w.CPUErr = "the processes' CPU time went backwards (a process ended in the window)"
	}
	if w.CPUErr != "" {
		w.CPU, w.GuestCPU = 0, 0
	}
	// Both are read in ticks, a moment apart: the guest's part is at most
	// the whole.
	w.GuestCPU = min(w.GuestCPU, w.CPU)
	w.ExitsErr = cmp.Or(s.ExitsErr, earlier.ExitsErr)
	if w.ExitsErr == "" && s.VMs == 0 {
		w.ExitsErr = "no KVM VM of the process in debugfs"
	}
	if w.ExitsErr != "" {
		return w
	}
	w.Exits = make(map[string]int64, len(s.Exits)+1)
	for _, c := range ExitCounters {
		d := int64(s.Exits[c.Name]) - int64(earlier.Exits[c.Name])
		if d < 0 {
			w.Exits, w.ExitsErr = nil, fmt.Sprintf("KVM counter %s went backwards (a VM ended in the window)", c.Name)
			return w
		}
		w.Exits[c.Name] = d
		if c.IODriven {
			w.Exits[IOExitsKey] += d
		}
	}
	return w
}

// ZeroSample is the sample of processes that do not exist yet (a window
// that starts at a VMM's exec): no CPU time, no VM.
func ZeroSample(at time.Time) WorkSample { return WorkSample{At: at, Exits: map[string]uint64{}} }

// exits sums the KVM counters of every VM the processes hold.
func (m WorkMeter) exits(pids []int) (map[string]uint64, int, string) {
	dir := filepath.Join(m.debugfs(), kvmDebugfs)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, "not measured: " + debugfsProblem(m.debugfs(), err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sum := map[string]uint64{}
	vms := 0
	seen := map[string]bool{}
	for _, pid := range pids {
		for _, vm := range m.vmDirs(pid, names) {
			if seen[vm] {
				continue
			}
			seen[vm] = true
			counters, err := ReadKVMCounters(filepath.Join(dir, vm))
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					continue // the VM ended while we read
				}
				return nil, 0, "not measured: " + err.Error()
			}
			for k, v := range counters {
				sum[k] += v
			}
			vms++
		}
	}
	return sum, vms, ""
}

// debugfsProblem says why the KVM directory of debugfs cannot be read.
func debugfsProblem(root string, err error) string {
	var st unix.Statfs_t
	switch {
	case errors.Is(err, os.ErrPermission):
		return "debugfs is readable by root only (" + err.Error() + ")"
	case unix.Statfs(root, &st) != nil || st.Type != unix.DEBUGFS_MAGIC:
		return "debugfs is not mounted on " + root + " (a kernel without CONFIG_DEBUG_FS, or not mounted: mount -t debugfs none " + root + ")"
	}
	return "KVM has no debugfs directory (" + err.Error() + "): no KVM module loaded?"
}

// vmDirs returns the debugfs directories (of names, "<tid>-<fd>") of pid's
// VMs. KVM names a VM's directory after the thread that created it and the
// VM's descriptor, so a directory is pid's when pid holds a kvm-vm
// descriptor of that number and the thread is one of pid's, or gone (a Go
// VMM may create its VM on a thread that has since exited).
func (m WorkMeter) vmDirs(pid int, names []string) []string {
	fdDir := filepath.Join(m.proc(), strconv.Itoa(pid), "fd")
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return nil
	}
	vmFDs := map[string]bool{}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && target == kvmVMLink {
			vmFDs[fd.Name()] = true
		}
	}
	var out []string
	for _, name := range names {
		tid, fd, ok := strings.Cut(name, "-")
		if !ok || !vmFDs[fd] {
			continue
		}
		if exists(filepath.Join(m.proc(), strconv.Itoa(pid), "task", tid)) || !exists(filepath.Join(m.proc(), tid)) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// ReadKVMCounters reads the ExitCounters of one VM's debugfs directory.
// A counter the kernel does not have is left out; one that does not parse
// is an error.
func ReadKVMCounters(dir string) (map[string]uint64, error) {
	return ReadKVMCountersOf(dir, ExitCounters)
}

// ReadKVMCountersOf is ReadKVMCounters of a given counter list.
func ReadKVMCountersOf(dir string, counters []ExitCounter) (map[string]uint64, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(counters))
	for _, c := range counters {
		b, err := readSmall(filepath.Join(dir, c.Name), maxCounter)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("KVM counter %s: %w", c.Name, err)
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("KVM counter %s of %s: want a number, got %q", c.Name, dir, strings.TrimSpace(string(b)))
		}
		out[c.Name] = v
	}
	if _, ok := out["exits"]; !ok {
		return nil, fmt.Errorf("%s has no exits counter: not a KVM VM's debugfs directory", dir)
	}
	return out, nil
}

// readSmall reads a file of at most limit bytes (longer is an error).
func readSmall(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, limit+1)
	n, err := f.Read(buf)
	if n > limit {
		return nil, fmt.Errorf("%s is longer than %d bytes", path, limit)
	}
	if n == 0 && err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// ensureDebugfs makes debugfs's KVM directory readable at root, mounting
// debugfs there when it is not mounted and this process is root. It
// returns why the exits cannot be measured, or "".
func ensureDebugfs(root string) string {
	dir := filepath.Join(root, kvmDebugfs)
	_, err := os.ReadDir(dir)
	if err == nil {
		return ""
	}
	var st unix.Statfs_t
	mounted := unix.Statfs(root, &st) == nil && st.Type == unix.DEBUGFS_MAGIC
	if !mounted && os.Geteuid() == 0 {
		if merr := unix.Mount("debugfs", root, "debugfs", 0, ""); merr != nil {
			if errors.Is(merr, unix.ENODEV) {
				return "the kernel has no debugfs (CONFIG_DEBUG_FS)"
			}
			return "mounting debugfs on " + root + ": " + merr.Error()
		}
		if _, err = os.ReadDir(dir); err == nil {
			return ""
		}
	}
	return debugfsProblem(root, err)
}

// String is w in one line: the exits by counter (the ones that moved),
// the CPU time and the wall time, or why either is not measured.
func (w Work) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "wall %v, ", w.Wall.Round(time.Millisecond))
	if w.CPUErr != "" {
		fmt.Fprintf(&b, "CPU %s", notMeasured(w.CPUErr))
	} else {
		fmt.Fprintf(&b, "CPU %v (guest %v)", w.CPU, w.GuestCPU)
	}
	if w.Exits == nil {
		fmt.Fprintf(&b, ", exits %s", notMeasured(w.ExitsErr))
		return b.String()
	}
	fmt.Fprintf(&b, ", %s %d", IOExitsKey, w.Exits[IOExitsKey])
	for _, c := range ExitCounters {
		if v := w.Exits[c.Name]; v != 0 {
			fmt.Fprintf(&b, " %s %d", c.Name, v)
		}
	}
	return b.String()
}
