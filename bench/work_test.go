package bench

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixtureDebugfs is a debugfs holding kvm/ with the VM directories of
// testdata/kvm-debugfs (4242-11: a VM's counters, as Linux 6.1 shows
// them; bad-12 with a malformed counter; notavm-13 without exits).
const fixtureDebugfs = "testdata/kvm-debugfs"

func TestReadKVMCounters(t *testing.T) {
	got, err := ReadKVMCounters(filepath.Join(fixtureDebugfs, "kvm", "4242-11"))
	require.NoError(t, err)
	assert.Equal(t, uint64(4692), got["exits"])
	assert.Equal(t, uint64(2), got["io_exits"])
	assert.Equal(t, uint64(136), got["mmio_exits"])
	assert.Equal(t, uint64(2161), got["irq_exits"])
	assert.Equal(t, uint64(3), got["signal_exits"])
	assert.Len(t, got, len(ExitCounters), "every counter of ExitCounters is in the fixture, and nothing else is read")
	assert.NotContains(t, got, "remote_tlb_flush")
}

func TestReadKVMCountersRejectsMalformed(t *testing.T) {
	_, err := ReadKVMCounters(filepath.Join(fixtureDebugfs, "kvm", "bad-12"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `io_exits of`)
	assert.Contains(t, err.Error(), `"12abc"`)

	_, err = ReadKVMCounters(filepath.Join(fixtureDebugfs, "kvm", "notavm-13"))
	require.ErrorContains(t, err, "no exits counter")

	big := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(big, "exits"), []byte(strings.Repeat("9", 100)), 0o644))
	_, err = ReadKVMCounters(big)
	require.ErrorContains(t, err, "longer than")

	_, err = ReadKVMCounters(filepath.Join(fixtureDebugfs, "kvm", "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestParseProcStat(t *testing.T) {
	b, err := os.ReadFile("testdata/procstat/qemu")
	require.NoError(t, err)
	st, err := ParseProcStat(b)
	require.NoError(t, err)
	assert.Equal(t, ProcStat{PID: 4242, PPID: 1, UTime: 12340 * time.Millisecond, STime: 5670 * time.Millisecond,
		CUTime: 890 * time.Millisecond, CSTime: 100 * time.Millisecond, GuestTime: 8 * time.Second, CGuestTime: 50 * time.Millisecond}, st)
	assert.Equal(t, 19*time.Second, st.CPU())
	assert.Equal(t, 8050*time.Millisecond, st.Guest())

	// comm may hold spaces and parentheses: the last ')' ends it.
	b, err = os.ReadFile("testdata/procstat/comm-with-parens")
	require.NoError(t, err)
	st, err = ParseProcStat(b)
	require.NoError(t, err)
	assert.Equal(t, 4250, st.PID)
	assert.Equal(t, 4242, st.PPID)
	assert.Equal(t, 100*time.Millisecond, st.CPU())
	assert.Zero(t, st.Guest(), "a kernel without guest_time: none")
}

func TestParseProcStatRejectsMalformed(t *testing.T) {
	good, err := os.ReadFile("testdata/procstat/qemu")
	require.NoError(t, err)
	fields := strings.Fields(string(good))
	with := func(i int, v string) string {
		f := append([]string(nil), fields...)
		f[i] = v
		return strings.Join(f, " ")
	}
	for name, text := range map[string]string{
		"empty":           "",
		"no comm":         "4242 qemu S 1",
		"no pid":          "(qemu) S 1 2 3",
		"pid not number":  "x (qemu) S 1",
		"truncated":       strings.Join(fields[:14], " "),
		"utime negative":  with(13, "-5"),
		"stime text":      with(14, "lots"),
		"ppid text":       with(3, "parent"),
		"only parens":     ")(",
		"cstime overflow": with(16, "9223372036854775807"),
		"guest_time text": with(42, "g"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseProcStat([]byte(text))
			assert.Error(t, err)
		})
	}
}

// fakeProc builds a procfs: each process's stat (pid, ppid, utime and
// stime in ticks), its threads and its descriptors (fd → link target).
type fakeProcess struct {
	pid, ppid    int
	utime, stime int
	guest        int // guest_time, part of utime
	tasks        []int
	fds          map[int]string
}

func fakeProc(t *testing.T, procs ...fakeProcess) string {
	t.Helper()
	root := t.TempDir()
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.pid))
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "fd"), 0o755))
		stat := strconv.Itoa(p.pid) + " (p) S " + strconv.Itoa(p.ppid) + " 1 1 0 -1 0 0 0 0 0 " +
			strconv.Itoa(p.utime) + " " + strconv.Itoa(p.stime) + " 0 0 20 0 1 0 1 1 1" +
			strings.Repeat(" 0", 42-24) + " " + strconv.Itoa(p.guest) + " 0 0 0 0 0 0 0 0 0"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "stat"), []byte(stat+"\n"), 0o644))
		for _, tid := range append([]int{p.pid}, p.tasks...) {
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "task", strconv.Itoa(tid)), 0o755))
			// procfs answers a thread's id too (readdir does not list it).
			require.NoError(t, os.MkdirAll(filepath.Join(root, strconv.Itoa(tid)), 0o755))
		}
		for fd, target := range p.fds {
			require.NoError(t, os.Symlink(target, filepath.Join(dir, "fd", strconv.Itoa(fd))))
		}
	}
	require.NoError(t, os.MkdirAll(filepath.Join(root, "self"), 0o755)) // not a pid: skipped
	return root
}

// fakeDebugfs builds debugfs's kvm directory with a VM directory per
// name, each with exits and io_exits.
func fakeDebugfs(t *testing.T, vms map[string][2]int) string {
	t.Helper()
	root := t.TempDir()
	for name, c := range vms {
		dir := filepath.Join(root, "kvm", name)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "exits"), []byte(strconv.Itoa(c[0])+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "io_exits"), []byte(strconv.Itoa(c[1])+"\n"), 0o644))
	}
	return root
}

func TestWorkMeterSampleFindsTheProcessesVMsAndDescendants(t *testing.T) {
	proc := fakeProc(t,
		fakeProcess{pid: 100, ppid: 1, utime: 50, stime: 25, guest: 30, tasks: []int{103}, fds: map[int]string{3: "/dev/kvm", 5: kvmVMLink, 6: "anon_inode:kvm-vcpu:0"}},
		fakeProcess{pid: 101, ppid: 100, utime: 10, stime: 0},                                    // a child: counted
		fakeProcess{pid: 102, ppid: 101, utime: 0, stime: 5},                                     // a grandchild: counted
		fakeProcess{pid: 200, ppid: 1, utime: 1000, stime: 0, fds: map[int]string{5: kvmVMLink}}, // another VMM
	)
	debugfs := fakeDebugfs(t, map[string][2]int{
		"103-5": {40, 4},     // 100's VM, made on its thread 103
		"200-5": {9000, 900}, // 200's VM: the same fd number, another process
		"100-6": {7, 7},      // fd 6 of 100 is no VM
	})
	m := WorkMeter{Proc: proc, Debugfs: debugfs}
	s := m.Sample(100)
	require.Empty(t, s.ExitsErr)
	require.Empty(t, s.CPUErr)
	assert.Equal(t, 1, s.VMs)
	assert.Equal(t, uint64(40), s.Exits["exits"])
	assert.Equal(t, uint64(4), s.Exits["io_exits"])
	assert.Equal(t, 900*time.Millisecond, s.CPU, "100 (750 ms), 101 (100 ms) and 102 (50 ms), not 200")
	assert.Equal(t, 300*time.Millisecond, s.GuestCPU)

	both := m.SampleCPUFirst(100, 200)
	assert.Equal(t, 2, both.VMs)
	assert.Equal(t, uint64(9040), both.Exits["exits"])
	assert.Equal(t, 10900*time.Millisecond, both.CPU)

	gone := m.Sample(999)
	assert.Empty(t, gone.ExitsErr)
	assert.Zero(t, gone.VMs)
	assert.Zero(t, gone.CPU)
}

func TestWorkMeterVMOfAnExitedThread(t *testing.T) {
	proc := fakeProc(t, fakeProcess{pid: 100, ppid: 1, fds: map[int]string{7: kvmVMLink}},
		fakeProcess{pid: 300, ppid: 1})
	m := WorkMeter{Proc: proc, Debugfs: fakeDebugfs(t, map[string][2]int{"150-7": {11, 1}, "300-7": {99, 9}})}
	s := m.Sample(100)
	assert.Equal(t, 1, s.VMs, "150 is no live thread anywhere: 100's; 300 is another live process's")
	assert.Equal(t, uint64(11), s.Exits["exits"])
}

func TestWorkWithoutDebugfsIsNotMeasuredNotZero(t *testing.T) {
	proc := fakeProc(t, fakeProcess{pid: 100, ppid: 1, utime: 1, fds: map[int]string{5: kvmVMLink}})
	m := WorkMeter{Proc: proc, Debugfs: t.TempDir()} // no kvm directory
	a, b := m.Sample(100), m.SampleCPUFirst(100)
	require.True(t, strings.HasPrefix(a.ExitsErr, "not measured: "), a.ExitsErr)
	assert.Contains(t, a.ExitsErr, "debugfs is not mounted")
	w := b.Sub(a)
	assert.Nil(t, w.Exits, "no exit counts, rather than zeros")
	assert.Equal(t, a.ExitsErr, w.ExitsErr)
	assert.Empty(t, w.CPUErr)
	assert.Contains(t, w.String(), "exits not measured: debugfs is not mounted")

	m.Debugfs = fakeDebugfs(t, map[string][2]int{"100-5": {1, 1}})
	_, err := os.Stat(filepath.Join(m.Debugfs, "kvm", "100-5"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(m.Debugfs, "kvm", "100-5", "mmio_exits"), []byte("x\n"), 0o644))
	s := m.Sample(100)
	assert.Contains(t, s.ExitsErr, "mmio_exits")
}

func TestWorkSampleSub(t *testing.T) {
	t0 := time.Unix(100, 0)
	a := WorkSample{At: t0, VMs: 1, CPU: time.Second, GuestCPU: 100 * time.Millisecond, Exits: map[string]uint64{"exits": 100, "io_exits": 10, "mmio_exits": 5, "halt_exits": 1}}
	b := WorkSample{At: t0.Add(3 * time.Second), VMs: 1, CPU: 1500 * time.Millisecond, GuestCPU: 400 * time.Millisecond, Exits: map[string]uint64{"exits": 250, "io_exits": 30, "mmio_exits": 45, "halt_exits": 1}}
	w := b.Sub(a)
	assert.Equal(t, 3*time.Second, w.Wall)
	assert.Equal(t, 500*time.Millisecond, w.CPU)
	assert.Equal(t, 300*time.Millisecond, w.GuestCPU)
	assert.Equal(t, int64(150), w.Exits["exits"])
	assert.Equal(t, int64(20), w.Exits["io_exits"])
	assert.Equal(t, int64(40), w.Exits["mmio_exits"])
	assert.Equal(t, int64(60), w.Exits[IOExitsKey])
	assert.Equal(t, int64(0), w.Exits["halt_exits"])

	// From a VMM's exec: no process before, so no work before.
	w = b.Sub(ZeroSample(t0))
	assert.Equal(t, int64(250), w.Exits["exits"])
	assert.Equal(t, 1500*time.Millisecond, w.CPU)

	// A VM that ended (its counters gone) is no negative work.
	w = a.Sub(b)
	assert.Nil(t, w.Exits)
	assert.Contains(t, w.ExitsErr, "went backwards")
	assert.Contains(t, w.CPUErr, "went backwards")
	assert.Zero(t, w.CPU)

	// No VM at the end: not measured, not zero.
	w = WorkSample{At: t0, Exits: map[string]uint64{}}.Sub(ZeroSample(t0))
	assert.Nil(t, w.Exits)
	assert.Contains(t, w.ExitsErr, "no KVM VM")

	w = WorkSample{At: t0, CPUErr: "not measured: x", VMs: 1, Exits: map[string]uint64{}}.Sub(a)
	assert.Equal(t, "not measured: x", w.CPUErr)
	assert.Zero(t, w.CPU)
}

// TestReadKVMCountersARM64: arm64's KVM names its counters differently
// (testdata/kvm-debugfs-arm64: Linux 6.1's arm64 names); its list reads
// them, with mmio_exit_user as the VMM-served I/O.
func TestReadKVMCountersARM64(t *testing.T) {
	counters := ExitCountersFor("arm64")
	got, err := ReadKVMCountersOf(filepath.Join("testdata/kvm-debugfs-arm64", "kvm", "7-12"), counters)
	require.NoError(t, err)
	assert.Equal(t, uint64(2210), got["exits"])
	assert.Equal(t, uint64(341), got["mmio_exit_user"])
	assert.Equal(t, uint64(95), got["mmio_exit_kernel"])
	assert.Equal(t, uint64(6), got["hvc_exit_stat"])
	assert.Equal(t, uint64(120), got["wfi_exit_stat"])
	assert.Len(t, got, len(counters), "every arm64 counter is in the fixture, and nothing else is read")
	var io []string
	for _, c := range counters {
		if c.IODriven {
			io = append(io, c.Name)
		}
	}
	assert.Equal(t, []string{"mmio_exit_user"}, io)
	assert.Equal(t, "io_exits", ExitCountersFor("amd64")[1].Name, "x86's list is unchanged")
	assert.Equal(t, ExitCountersFor(runtime.GOARCH), ExitCounters)
}
