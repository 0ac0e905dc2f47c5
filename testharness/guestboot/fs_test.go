package guestboot

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

func TestFSFigureLineRoundTrip(t *testing.T) {
	for _, f := range []FSFigure{
		{System: FSOursVirtioFS, Run: 2, Result: fsbench.Result{Workload: fsbench.WorkloadSeq, Values: map[string]int64{"bytes": 16 << 20, "write_ns": 2e9, "read_ns": 1e9}}},
		{System: FSQemuVirtiofsd, Run: 1, Result: fsbench.Result{Workload: fsbench.WorkloadPython, Err: `chroot: "x" # not found`}},
		{System: FSOursNineP, Run: 3, Result: fsbench.Result{Workload: fsbench.WorkloadGit, Skip: "no git"}},
	} {
		line := f.FigureLine()
		got, ok := ParseFSFigureLine("    fs_test.go:80: guest: " + line)
		require.True(t, ok, line)
		require.Equal(t, f, got)
	}
	seq := FSFigure{System: FSQemuNineP, Run: 1, Result: fsbench.Result{Workload: fsbench.WorkloadSeq, Values: map[string]int64{"bytes": 64 << 20, "write_ns": 2e9, "read_ns": 1e9}}}
	require.Contains(t, seq.FigureLine(), " # seq_write 33.6 MB/s (64 MiB in 2s); seq_read 67.1 MB/s (64 MiB in 1s)")
	for _, bad := range []string{
		"no figure",
		"FSFIGURE system=x run=one workload=seq bytes=1",
		"FSFIGURE system=x workload=seq bytes=1",
		"FSFIGURE run=1 system=x workload=seq bytes=1 extra",
		"FSFIGURE system=x run=1 workload=seq",
		"FSFIGURE system=x run=0 workload=seq bytes=1",
		"FSFIGURE system= run=1 workload=seq bytes=1",
	} {
		_, ok := ParseFSFigureLine(bad)
		require.False(t, ok, bad)
	}
}

func TestFSSkipLineRoundTrip(t *testing.T) {
	line := FSSkipLine(FSQemuVirtiofsd, `no virtiofsd ("looked")`)
	system, reason, ok := ParseFSSkipLine("guest: " + line)
	require.True(t, ok)
	require.Equal(t, FSQemuVirtiofsd, system)
	require.Equal(t, `no virtiofsd ("looked")`, reason)
	for _, bad := range []string{"FSSKIP system=x", "FSSKIP system= reason=\"\"", `FSSKIP system=x reason="unterminated`} {
		_, _, ok := ParseFSSkipLine(bad)
		require.False(t, ok, bad)
	}
}

func TestFSResultsFromConsole(t *testing.T) {
	seq := fsbench.Result{Workload: fsbench.WorkloadSeq, Values: map[string]int64{"bytes": 1 << 20, "write_ns": 5, "read_ns": 6}}
	walk := fsbench.Result{Workload: fsbench.WorkloadWalk, Err: "lstat: EIO"}
	got, err := FSResults("[ 0.5] booting\r\nTESTINIT OK cpus=0 uptime=0.6\r\n" + seq.Line() + "\r\n" + walk.Line() + "\r\n" + fsbench.EndMarker + "\r\nTESTINIT DONE\r\n")
	require.NoError(t, err)
	require.Equal(t, []fsbench.Result{seq, walk}, got)

	_, err = FSResults("TESTINIT OK\n" + seq.Line() + "\nTESTINIT DONE\n")
	require.ErrorContains(t, err, "did not finish")
	_, err = FSResults(fsbench.Marker + " workload=seq bytes=x\n" + fsbench.EndMarker + "\n")
	require.Error(t, err)
}

func TestCollectFSMediansAndSpeedups(t *testing.T) {
	fig := func(system string, run int, readNS, coldNS int64) []FSFigure {
		return []FSFigure{
			{System: system, Run: run, Result: fsbench.Result{Workload: fsbench.WorkloadSeq, Values: map[string]int64{"bytes": 1 << 20, "write_ns": 10, "read_ns": readNS}}},
			{System: system, Run: run, Result: fsbench.Result{Workload: fsbench.WorkloadWalk, Values: map[string]int64{"files": 100, "cold_ns": coldNS, "warm_ns": coldNS}}},
			{System: system, Run: run, Result: fsbench.Result{Workload: fsbench.WorkloadPython, Err: "no python"}},
		}
	}
	var figs []FSFigure
	for run, v := range []int64{100, 300, 200} {
		figs = append(figs, fig(FSOursVirtioFS, run+1, v, v)...)
		figs = append(figs, fig(FSOursNineP, run+1, 2*v, 10*v)...)
		figs = append(figs, fig(FSQemuNineP, run+1, 5*v, 3*v)...)
	}
	s := CollectFS(figs)
	d, ok := s.Median(FSOursVirtioFS, "seq_read")
	require.True(t, ok)
	require.Equal(t, time.Duration(200), d)
	_, ok = s.Median(FSOursVirtioFS, "python_cold")
	require.False(t, ok, "a failed workload has no figure")
	_, ok = s.Median(FSQemuVirtiofsd, "seq_read")
	require.False(t, ok)
	require.Equal(t, []string{FSOursVirtioFS, FSOursNineP, FSQemuNineP}, s.Systems())
	require.Equal(t, []time.Duration{100, 300, 200}, s.Times(FSOursVirtioFS, "seq_read"))
	desc, ok := s.DescribeMedian(FSOursVirtioFS, "walk_cold")
	require.True(t, ok)
	require.Equal(t, "0s (100 files) [3 run(s)]", desc)

	speed := map[[2]string]float64{}
	for _, sp := range s.Speedups() {
		speed[[2]string{sp.Metric, sp.Versus}] = sp.Speedup
	}
	require.InDelta(t, 5, speed[[2]string{"seq_read", FSQemuNineP}], 1e-9)
	require.InDelta(t, 10, speed[[2]string{"walk_cold", FSOursNineP}], 1e-9)
	require.InDelta(t, 1, speed[[2]string{"seq_write", FSOursNineP}], 1e-9)
	require.NotContains(t, speed, [2]string{"seq_read", FSQemuVirtiofsd})
	for _, sp := range s.Speedups() {
		require.Equal(t, FSOursVirtioFS, sp.System)
	}

	// The block-device systems are compared with each other only.
	for run, v := range []int64{100, 300, 200} {
		figs = append(figs, fig(FSOursBlk, run+1, v, v)[0], fig(FSQemuBlk, run+1, 3*v, v)[0])
	}
	s = CollectFS(figs)
	require.Equal(t, []string{FSOursVirtioFS, FSOursNineP, FSQemuNineP, FSOursBlk, FSQemuBlk}, s.Systems())
	var blk []FSSpeedup
	for _, sp := range s.Speedups() {
		if sp.System == FSOursBlk || sp.Versus == FSOursBlk || sp.Versus == FSQemuBlk {
			blk = append(blk, sp)
		}
	}
	require.Equal(t, []FSSpeedup{
		{Metric: "seq_write", System: FSOursBlk, Versus: FSQemuBlk, Speedup: 1},
		{Metric: "seq_read", System: FSOursBlk, Versus: FSQemuBlk, Speedup: 3},
	}, blk)
	for _, target := range FSTargets {
		_, ok := fsbench.MetricByID(target.Metric)
		require.True(t, ok, target.Metric)
	}
}

func TestFSSizesFromEnv(t *testing.T) {
	t.Setenv(EnvFSBench, "")
	s, err := FSSizesFromEnv()
	require.NoError(t, err)
	require.Equal(t, FSSizesCI, s)
	t.Setenv(EnvFSBench, "full")
	s, err = FSSizesFromEnv()
	require.NoError(t, err)
	require.Equal(t, FSSizesFull, s)
	t.Setenv(EnvFSBench, "huge")
	_, err = FSSizesFromEnv()
	require.Error(t, err)
	s, err = ParseFSSizes("runs=3,tree=10x100")
	require.NoError(t, err)
	require.Equal(t, FSSizes{Runs: 3, MiB: FSSizesCI.MiB, RandReads: FSSizesCI.RandReads, Dirs: 10, FilesPerDir: 100}, s)
	for _, bad := range []string{"runs=0", "mib=x", "tree=10", "size=3"} {
		_, err := ParseFSSizes(bad)
		require.Error(t, err, bad)
	}
}

func TestQemuNinePArgs(t *testing.T) {
	args, err := QemuNinePArgs("/tmp/d", "tag", false)
	require.NoError(t, err)
	require.Equal(t, []string{"-fsdev", "local,id=tag,path=/tmp/d,security_model=none", "-device", "virtio-9p-device,fsdev=tag,mount_tag=tag"}, args)
	args, err = QemuNinePArgs("/", "root", true)
	require.NoError(t, err)
	require.Equal(t, "local,id=root,path=/,security_model=none,readonly=on", args[1])
	_, err = QemuNinePArgs("/tmp/a,b", "tag", false)
	require.Error(t, err)
}

func TestSuites(t *testing.T) {
	var all []string
	for _, suite := range FSSuites {
		require.Equal(t, suite.Ours, suite.Systems[0], suite.ID)
		all = append(all, suite.Systems...)
	}
	require.Equal(t, FSSystems, all, "every system in one suite, in run order")
	require.True(t, IsBlk(FSQemuBlk))
	require.False(t, IsBlk(FSQemuNineP))
	require.Equal(t, "cowork-vmm virtio-blk", FSSystemLabel(FSOursBlk))
	require.Equal(t, "2 run(s), 16 MiB written and read on a raw 16 MiB disk image, 5 random 4 KiB reads", FSSuiteBlk.Sizes(FSSizes{Runs: 2, MiB: 16, RandReads: 5}))
}

func TestQemuBlkArgs(t *testing.T) {
	args, err := QemuBlkArgs("/tmp/d/disk.img", "d")
	require.NoError(t, err)
	require.Equal(t, []string{"-drive", "file=/tmp/d/disk.img,if=none,format=raw,id=d,cache=writeback,aio=threads", "-device", "virtio-blk-device,drive=d"}, args)
	_, err = QemuBlkArgs("/tmp/a,b", "d")
	require.Error(t, err)
	_, err = QemuBlkArgs("/tmp/a", "d,x=y")
	require.Error(t, err)
}

func TestMakeTreeAndCheckSeqFile(t *testing.T) {
	dir := t.TempDir()
	tree := filepath.Join(dir, fsbench.TreeDir)
	require.NoError(t, os.MkdirAll(filepath.Join(tree, "stale"), 0o755))
	require.NoError(t, MakeTree(tree, 3, 4))
	entries, err := os.ReadDir(tree)
	require.NoError(t, err)
	require.Len(t, entries, 3, "what was there is replaced")
	data, err := os.ReadFile(filepath.Join(tree, fsbench.TreeDirName(2), fsbench.TreeFileName(3)))
	require.NoError(t, err)
	require.Equal(t, fsbench.TreeFileContent(2, 3), data)
	st, err := os.Stat(filepath.Join(tree, fsbench.TreeDirName(1), fsbench.TreeFileName(0)))
	require.NoError(t, err)
	require.True(t, st.ModTime().Equal(treeTime))

	seq := filepath.Join(dir, fsbench.FileName)
	block := make([]byte, fsbench.BlockSize)
	f, err := os.Create(seq)
	require.NoError(t, err)
	for i := range 2 {
		fsbench.FillPattern(block)
		fsbench.StampBlock(block, i)
		_, err := f.Write(block)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	require.NoError(t, CheckSeqFile(seq, 2))
	require.ErrorContains(t, CheckSeqFile(seq, 3), "bytes")
	require.NoError(t, os.Truncate(seq, fsbench.BlockSize))
	require.NoError(t, CheckSeqFile(seq, 1))
	require.Error(t, CheckSeqFile(filepath.Join(dir, "missing"), 1))
}
