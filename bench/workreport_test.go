package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsrun"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/sdkturn"
)

// work is a Work with exits (io_exits, mmio_exits, halt_exits, as
// counted) and CPU, a quarter of it the guest's.
func work(exits, io, mmio, halt int64, cpu time.Duration) Work {
	return Work{Wall: 2 * cpu, CPU: cpu, GuestCPU: cpu / 4, Exits: map[string]int64{"exits": exits, "io_exits": io, "mmio_exits": mmio, "halt_exits": halt, IOExitsKey: io + mmio}}
}

// sampleWork is two boots and two 32 MiB reads of ours and the peers.
func sampleWork() *WorkResults {
	r := NewWorkResults()
	r.Add(SystemOurs, "ours", WorkBoot, 1, work(3000, 270, 310, 1, 3*time.Second))
	r.Add(SystemOurs, "ours", WorkBoot, 1, work(2800, 272, 308, 3, 5*time.Second))
	r.Add(SystemQemuMicro, "qemu microvm", WorkBoot, 1, work(46000, 40000, 600, 0, 10*time.Second))
	r.Add(SystemQemuMicro, "qemu microvm", WorkBoot, 1, work(47000, 40200, 600, 0, 12*time.Second))
	// 32 MiB read: ours 3200 io+mmio (100/MiB), qemu + virtiofsd 9600 (300/MiB).
	r.Add("ours-virtiofs", "ours virtio-fs", "seq_read", 32, work(6400, 0, 3200, 0, 640*time.Millisecond))
	r.Add("ours-virtiofs", "ours virtio-fs", "seq_read", 32, work(6400, 0, 3200, 0, 960*time.Millisecond))
	r.Add("qemu-virtiofsd", "qemu + virtiofsd", "seq_read", 32, work(9600, 0, 9600, 0, 640*time.Millisecond))
	r.Add("qemu-virtiofsd", "qemu + virtiofsd", "seq_read", 32, Work{Wall: time.Second, CPU: 640 * time.Millisecond, ExitsErr: "not measured: debugfs went away"})
	r.Add("qemu-virtiofsd", "qemu + virtiofsd", "seq_read", 0, work(1, 1, 1, 1, time.Hour)) // no units: not recorded
	r.Add(SystemOurs, "ours", WorkConnect, 1, Work{Wall: time.Second, CPU: time.Second, ExitsErr: "not measured: debugfs is not mounted"})
	return r
}

func TestWorkReportPerOp(t *testing.T) {
	rep := sampleWork().Report()
	require.NotNil(t, rep)
	ours := rep.system(SystemOurs)
	require.NotNil(t, ours)
	boot := ours.op(WorkBoot)
	require.NotNil(t, boot)
	assert.Equal(t, 2, boot.Runs)
	assert.Equal(t, 2900.0, boot.ExitsPerOp["exits"], "median of 3000 and 2800")
	assert.Equal(t, 580.0, boot.ExitsPerOp[IOExitsKey], "the median of 580 and 580")
	assert.Equal(t, 4000.0, boot.CPUMSPerOp)
	assert.Equal(t, 1000.0, boot.GuestCPUMSPerOp)
	assert.Equal(t, 3000.0, boot.VMMCPUMSPerOp)
	assert.Equal(t, "boot", boot.Unit)
	assert.False(t, boot.Net, "no marks: nothing taken off")

	read := rep.system("ours-virtiofs").op("seq_read")
	require.NotNil(t, read)
	assert.Equal(t, 32.0, read.Units)
	assert.Equal(t, 100.0, read.ExitsPerOp[IOExitsKey], "3200 exits over 32 MiB")
	assert.Equal(t, 25.0, read.CPUMSPerOp, "the median of 20 and 30 ms per MiB")
	assert.Equal(t, 50.0, read.WallMSPerOp)
	require.Len(t, read.Samples, 2)
	assert.Equal(t, 20.0, read.Samples[0].CPUMSPerOp)

	peer := rep.system("qemu-virtiofsd").op("seq_read")
	require.NotNil(t, peer)
	assert.Equal(t, 2, peer.Runs, "the run of no units is left out")
	assert.Equal(t, 300.0, peer.ExitsPerOp[IOExitsKey], "the median of the runs that measured exits")
	assert.Empty(t, peer.ExitsNotMeasured)

	connect := ours.op(WorkConnect)
	require.NotNil(t, connect)
	assert.Nil(t, connect.ExitsPerOp)
	assert.Equal(t, "not measured: debugfs is not mounted", connect.ExitsNotMeasured)
	assert.Equal(t, 1000.0, connect.CPUMSPerOp)

	assert.Nil(t, NewWorkResults().Report())
}

func TestWorkReportRatiosAndTargets(t *testing.T) {
	rep := sampleWork().Report()
	ratio := func(op, system, versus string) WorkRatioReport {
		for _, r := range rep.Ratios {
			if r.Op == op && r.System == system && r.Versus == versus {
				return r
			}
		}
		t.Fatalf("no ratio %s %s/%s in %+v", op, system, versus, rep.Ratios)
		return WorkRatioReport{}
	}
	boot := ratio(WorkBoot, SystemOurs, SystemQemuMicro)
	assert.Equal(t, roundRatio(2900.0/46500), boot.Exits)
	assert.Equal(t, roundRatio(580.0/40700), boot.IOExits)
	assert.Equal(t, roundRatio(4000.0/11000), boot.CPU)
	read := ratio("seq_read", "ours-virtiofs", "qemu-virtiofsd")
	assert.Equal(t, 0.333, read.IOExits)
	assert.Equal(t, 1.25, read.CPU)

	require.Len(t, rep.Targets, len(workTargets))
	byLabel := map[string]WorkTargetReport{}
	for _, tr := range rep.Targets {
		byLabel[tr.Label] = tr
	}
	io := byLabel[workTargets[0].Label]
	assert.True(t, io.Measured)
	assert.True(t, io.Met, "100 ≤ 0.5 × 300")
	assert.Equal(t, 100.0, io.Ours)
	assert.Equal(t, 300.0, io.Theirs)
	bootTarget := byLabel[workTargets[1].Label]
	assert.True(t, bootTarget.Met)
	cpu := byLabel[workTargets[2].Label]
	assert.True(t, cpu.Measured)
	assert.False(t, cpu.Met, "25 ms > 20 ms per MiB")
	assert.Equal(t, 1.25, cpu.Ratio)

	// A peer that did not run: not measured, and why.
	r := NewWorkResults()
	r.Add(SystemOurs, "ours", WorkBoot, 1, work(10, 5, 5, 0, time.Second))
	for _, tr := range r.Report().Targets {
		assert.False(t, tr.Measured, tr.Label)
		assert.False(t, tr.Met, tr.Label)
		assert.NotEmpty(t, tr.Why, tr.Label)
	}
}

func TestWorkReportRendering(t *testing.T) {
	r := sampleWork()
	r.Note("KVM exits not measured: example")
	rep := Report{Runs: 2, Backend: "kvm", Work: r.Report()}
	var md bytes.Buffer
	require.NoError(t, WriteMarkdown(&md, rep))
	out := md.String()
	assert.Contains(t, out, "### Work per operation")
	assert.Contains(t, out, "| start → /init (per boot) | ours | 2 | 2900 | 580 | — | — | 2.00 | — | — | 4000 | 1000 | 3000 | 8000 |")
	assert.Contains(t, out, "| sequential read, cache dropped (per MiB read) | ours virtio-fs | 2 | 200 | 100 |")
	assert.Contains(t, out, "| sequential read, cache dropped | ours-virtiofs / qemu-virtiofsd | 0.67× | 0.33× | 1.25× | 1.07× |")
	assert.Contains(t, out, "- target: VMM CPU-ms per MiB read, less the guest's own, ≤ qemu + virtiofsd's: ours-virtiofs 18.8 CPU-ms vs qemu-virtiofsd 17.5 per MiB read: 1.07×, not met")
	assert.Contains(t, out, "- target: I/O-driven exits (io+mmio) per MiB read ≤ 0.5× qemu + virtiofsd's: ours-virtiofs 100 exits vs qemu-virtiofsd 300 per MiB read: 0.33×, met")
	assert.Contains(t, out, "- target: VMM CPU-ms per MiB read ≤ qemu + virtiofsd's (both processes): ours-virtiofs 25.0 CPU-ms vs qemu-virtiofsd 20.0 per MiB read: 1.25×, not met")
	assert.Contains(t, out, "- ours, /init → agent connected: exits not measured: debugfs is not mounted")
	assert.Contains(t, out, "Scale with wall time")
	assert.Contains(t, out, "halt_exits, halt_wakeup, irq_exits, irq_window_exits")
	assert.Contains(t, out, "Scale with the work asked of the VMM (the same on any host): io_exits, mmio_exits, pf_taken")
	assert.Contains(t, out, "- KVM exits not measured: example")
	assert.Less(t, strings.Index(out, "start → /init (per boot)"), strings.Index(out, "sequential read, cache dropped (per MiB read)"), "boot before the fs ops")

	var svg bytes.Buffer
	require.NoError(t, WriteSVG(&svg, rep))
	s := svg.String()
	assert.Contains(t, s, "Work: I/O-driven exits (io+mmio) per operation")
	assert.Contains(t, s, "Work: the VMM&#39;s CPU time per operation")
	assert.Contains(t, s, `data-phase="seq_read" data-system="ours-virtiofs"`)
	assert.Contains(t, s, "<title>ours-virtiofs: 100</title>", "the io+mmio bar of ours' read")
	assert.Contains(t, s, "<title>qemu-virtiofsd: 300</title>")
	assert.Contains(t, s, "<title>cowork-vmm: 4000</title>", "the CPU bar of ours' boot")

	// The JSON keeps what the Markdown is made of.
	var js bytes.Buffer
	require.NoError(t, WriteJSON(&js, rep))
	var back Report
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	require.NotNil(t, back.Work)
	assert.Equal(t, rep.Work.Targets, back.Work.Targets)
	var md2 bytes.Buffer
	require.NoError(t, WriteMarkdown(&md2, back))
	assert.Equal(t, out, md2.String())
}

func TestWorkReportNetOfMarks(t *testing.T) {
	r := NewWorkResults()
	marks := func(io int64, cpu time.Duration) Work { return work(io+5, io, 0, 0, cpu) }
	r.Add("ours-virtiofs", "ours", fsbench.MarkEmpty, 1, marks(44, 40*time.Millisecond))
	r.Add("ours-virtiofs", "ours", fsbench.MarkEmpty, 1, marks(46, 80*time.Millisecond))
	r.Add("ours-virtiofs", "ours", fsbench.MarkEmpty, 1, marks(45, 60*time.Millisecond))
	// 32 MiB: 45 port-I/O exits of marks, 32 kicks; 60 ms of marks.
	r.Add("ours-virtiofs", "ours", "seq_read", 32, work(45+5+64, 45, 32, 0, 60*time.Millisecond+640*time.Millisecond))
	// A window that cost less than the median of the empty ones: 0, not negative.
	r.Add("ours-virtiofs", "ours", "walk_warm", 1, work(10, 10, 0, 0, 0))
	rep := r.Report()
	read := rep.system("ours-virtiofs").op("seq_read")
	require.NotNil(t, read)
	assert.True(t, read.Net)
	assert.Equal(t, 1.0, read.ExitsPerOp[IOExitsKey], "(45+32 − 45) / 32")
	assert.Equal(t, 0.0, read.ExitsPerOp["io_exits"])
	assert.Equal(t, 2.0, read.ExitsPerOp["exits"], "(114 − 50) / 32")
	assert.Equal(t, 20.0, read.CPUMSPerOp, "(700 − 60) ms / 32")
	walk := rep.system("ours-virtiofs").op("walk_warm")
	assert.Equal(t, 0.0, walk.ExitsPerOp[IOExitsKey])
	assert.Equal(t, 0.0, walk.CPUMSPerOp)
	// The I/O-driven figure is the sum of the net counters, each at least
	// 0: not the net of the sums, which a baseline heavy in one counter
	// would eat into the other's (seen with qemu: 78 port I/O and 16 MMIO
	// exits in its empty window, 50 and 64 in a read).
	q := NewWorkResults()
	q.Add("qemu-virtiofsd", "q", fsbench.MarkEmpty, 1, work(94, 78, 16, 0, 0))
	q.Add("qemu-virtiofsd", "q", "seq_read", 32, work(114, 50, 64, 0, 0))
	qread := q.Report().system("qemu-virtiofsd").op("seq_read")
	assert.Equal(t, 1.5, qread.ExitsPerOp[IOExitsKey], "(0 + 48) / 32")
	assert.Equal(t, 0.0, qread.ExitsPerOp["io_exits"])

	empty := rep.system("ours-virtiofs").op(fsbench.MarkEmpty)
	require.NotNil(t, empty)
	assert.False(t, empty.Net, "the empty window is shown as measured")
	assert.Equal(t, 45.0, empty.ExitsPerOp[IOExitsKey])
}

func TestFSWorkUnits(t *testing.T) {
	results := []fsbench.Result{
		{Workload: fsbench.WorkloadSeq, Values: map[string]int64{"bytes": 32 << 20, "write_ns": 5, "read_ns": 7}},
		{Workload: fsbench.WorkloadRand, Values: map[string]int64{"reads": 1000, "ns": 9}},
		{Workload: fsbench.WorkloadWalk, Values: map[string]int64{"cold_ns": 3, "warm_ns": 2}},
		{Workload: fsbench.WorkloadPython, Values: map[string]int64{"cold_ns": 3, "warm_ns": 2, "warm_runs": 3}},
		{Workload: fsbench.WorkloadGit, Err: "git failed"},
	}
	for metric, want := range map[string]float64{
		"seq_read": 32, "seq_write": 32, "rand_read": 1000, "walk_cold": 1, "walk_warm": 1,
		"python_cold": 1, "python_warm": 3, "git_cold": 0, "ram_read": 0, "nonsense": 0, fsbench.MarkEmpty: 1,
	} {
		assert.Equal(t, want, fsWorkUnits(metric, results), metric)
	}
}

func TestBootWorkOps(t *testing.T) {
	t0 := time.Unix(0, 0)
	b := newBootWork(WorkMeter{}, 0)
	at := func(name string, d time.Duration, exits uint64, cpu time.Duration) {
		b.set(name, WorkSample{At: t0.Add(d), VMs: 1, CPU: cpu, Exits: map[string]uint64{"exits": exits}})
	}
	b.set(MarkStartSent, ZeroSample(t0))
	at(MarkInit, time.Second, 100, 500*time.Millisecond)
	at(MarkInit, 9*time.Second, 999, time.Hour) // a second sample of an instant is ignored
	at(MarkConnected, 3*time.Second, 160, 800*time.Millisecond)
	ops := b.ops()
	assert.Equal(t, int64(100), ops[WorkBoot].Exits["exits"])
	assert.Equal(t, int64(60), ops[WorkConnect].Exits["exits"])
	assert.Equal(t, 300*time.Millisecond, ops[WorkConnect].CPU)
	assert.Equal(t, int64(160), ops[WorkStartConnected].Exits["exits"])
	assert.NotContains(t, ops, WorkSpawn, "no spawn was sampled")

	var none *bootWork
	none.mark(MarkInit, true) // not metered: nothing, no panic
	assert.Nil(t, none.ops())
}

func TestFSWorkPairsMarks(t *testing.T) {
	proc := fakeProc(t, fakeProcess{pid: 100, ppid: 1, utime: 10, fds: map[int]string{5: kvmVMLink}})
	f := newFSWork(WorkMeter{Proc: proc, Debugfs: fakeDebugfs(t, map[string][2]int{"100-5": {7, 3}})})
	f.mark("walk_cold", false, []int{100}) // an end without a begin: nothing
	f.onMark(fsrun.Mark{Metric: "seq_read", Begin: true, PIDs: []int{100}})
	f.onMark(fsrun.Mark{Metric: "seq_read", Begin: false, PIDs: []int{100}})
	got := f.take()
	require.Len(t, got, 1)
	w := got["seq_read"]
	assert.Empty(t, w.ExitsErr)
	assert.Equal(t, int64(0), w.Exits["exits"], "no exits between the two samples")
	assert.Empty(t, f.take(), "take forgets")
}

// Every SDK turn the test guest marks has its row in the work report, under
// the name the guest marks it with.
func TestWorkOpsNameEverySDKTurn(t *testing.T) {
	for _, turn := range sdkturn.Turns {
		found := false
		for _, op := range WorkOps {
			found = found || op.ID == sdkturn.WorkOp(turn)
		}
		if !found {
			t.Errorf("no WorkOps row for %s's mark %q", turn.ID, sdkturn.WorkOp(turn))
		}
	}
}
