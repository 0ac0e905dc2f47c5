package guestboot

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot/fsbench"
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
	for _, s := range []FSSizes{FSSizesCI, FSSizesFull} {
		b := FSBench{Sizes: s, Dir: "/d", Root: "/"}
		b.withDefaults()
		for _, system := range FSSystems {
			require.NoError(t, b.config(system).Validate(), "%s: %s", system, s)
		}
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

func TestPrepareLeavesOutWhatCannotRun(t *testing.T) {
	b := FSBench{Dir: t.TempDir(), Sizes: FSSizes{Runs: 1, MiB: 1, RandReads: 1, Dirs: 2, FilesPerDir: 3}}
	notes, err := b.Prepare(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{fsbench.WorkloadSeq, fsbench.WorkloadRand, fsbench.WorkloadWalk}, b.Workloads)
	require.Len(t, notes, 2)
	require.Contains(t, notes[0], "no host root")

	root := t.TempDir() // a root without python, git or /mnt
	b = FSBench{Dir: t.TempDir(), Root: root, Sizes: b.Sizes}
	notes, err = b.Prepare(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{fsbench.WorkloadSeq, fsbench.WorkloadRand, fsbench.WorkloadWalk}, b.Workloads)
	require.Len(t, notes, 2)
	require.Contains(t, strings.Join(notes, "\n"), fsbench.GitPath)
	require.Contains(t, strings.Join(notes, "\n"), fsbench.PythonPath)
}

func TestPrepareCommitsTheTree(t *testing.T) {
	if gitUnavailable("/") != "" {
		t.Skip(gitUnavailable("/"))
	}
	b := FSBench{Dir: t.TempDir(), Root: "/", Sizes: FSSizes{Runs: 1, MiB: 1, RandReads: 1, Dirs: 2, FilesPerDir: 3}}
	_, err := b.Prepare(context.Background())
	require.NoError(t, err)
	require.Contains(t, b.Workloads, fsbench.WorkloadGit)
	// The repository is clean for git status as the guest runs it.
	cmd := exec.Command("git", fsbench.GitArgs...)
	cmd.Dir = filepath.Join(b.Dir, fsbench.TreeDir)
	cmd.Env = fsbench.GitEnv
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Empty(t, string(out))
}

func TestBusyWindow(t *testing.T) {
	require.Positive(t, machineBusy(), "this machine has run something since boot")
	w := &busyWindow{end: fsbench.EndMarker}
	_, err := w.Write([]byte("[ 0.1] boot\r\nTESTINIT OK cpus=0 uptime=0.2\r\n"))
	require.NoError(t, err)
	wall, _ := w.result()
	require.Zero(t, wall, "no end line yet")
	time.Sleep(20 * time.Millisecond)
	_, err = w.Write([]byte(fsbench.Marker + " workload=seq bytes=1\r\n" + fsbench.EndMarker + "\r\nTESTINIT DONE\r\n"))
	require.NoError(t, err)
	wall, busy := w.result()
	require.GreaterOrEqual(t, wall, 20*time.Millisecond)
	require.GreaterOrEqual(t, busy, time.Duration(0))
}

// TestFSBench runs the file-system benchmark (FSBench) on every system
// that can run here, interleaved, the sizes EnvFSBench selects, one vCPU:
// the test guest shares the same directory and the host's root on each.
// It prints an FSFIGURE line per system, run and workload (FSSKIP for a
// system that cannot run); internal/nested's TestNestedFSBench runs it
// inside the nested harness and reports the medians and speed-ups. It
// fails when a guest reports an error, except qemu + virtiofsd's (the
// reference daemon may not run everywhere: its row is then left out).
func TestFSBench(t *testing.T) {
	kernel, initrd := guestFiles(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	sizes, err := FSSizesFromEnv()
	require.NoError(t, err)
	t.Logf("fs bench: %s", sizes)
	logger := slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b := &FSBench{Kernel: kernel, Initrd: initrd, Dir: t.TempDir(), Root: "/", Sizes: sizes, Logger: logger}
	if v := os.Getenv(EnvFSGoMaxProcs); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "%s=%q", EnvFSGoMaxProcs, v)
		b.GoMaxProcs = n
	}
	start := time.Now()
	notes, err := b.Prepare(context.Background())
	require.NoError(t, err)
	t.Logf("fs bench: tree of %d files made in %v; workloads %s", sizes.Dirs*sizes.FilesPerDir, time.Since(start).Round(time.Millisecond), strings.Join(b.Workloads, ","))
	for _, n := range notes {
		t.Log("fs bench: " + n)
	}
	warmHostRoot(t)

	systems := []string{}
	for _, s := range FSSystems {
		if why := b.Unavailable(s); why != "" {
			t.Log(FSSkipLine(s, why))
			continue
		}
		systems = append(systems, s)
	}
	for run := 1; run <= sizes.Runs; run++ {
		for _, system := range slices.Clone(systems) {
			res, err := b.Run(context.Background(), system, run)
			if system == FSQemuVirtiofsd && err != nil {
				t.Log(FSSkipLine(system, firstLine(err.Error())))
				t.Logf("%s run %d: %v", system, run, err)
				systems = slices.DeleteFunc(systems, func(s string) bool { return s == system })
				continue
			}
			require.NoError(t, err, "%s, run %d", system, run)
			t.Logf("%s run %d: outer machine busy %v of %v from ready to end; %d KVM_RUNs, %d MMIO exits",
				system, run, res.Busy, res.Window.Round(time.Millisecond), res.Exits.Runs, res.Exits.MMIOExits)
			for _, f := range res.Figures() {
				t.Log(f.FigureLine())
				if f.Result.Err != "" && system != FSQemuVirtiofsd {
					t.Errorf("%s run %d: workload %s failed: %s", system, run, f.Result.Workload, f.Result.Err)
				}
			}
		}
	}
	nested.RecordLinuxBoot(t)
}

// warmHostRoot runs the host's python3 once, so the first system measured
// does not pay for bringing its files into this machine's page cache (in
// the harness, from the real host over qemu's 9p).
func warmHostRoot(t *testing.T) {
	start := time.Now()
	if out, err := exec.Command(fsbench.PythonPath, fsbench.PythonArgs...).CombinedOutput(); err != nil {
		t.Logf("warming the host's python3: %v: %s", err, out)
		return
	}
	start2 := time.Now()
	_ = exec.Command(fsbench.PythonPath, fsbench.PythonArgs...).Run()
	t.Logf("host python3 -c 'import json': %v cold, %v warm (this machine, no VM)", start2.Sub(start).Round(time.Millisecond), time.Since(start2).Round(time.Millisecond))
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// testLogWriter sends the VMM's warnings to the test log.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
