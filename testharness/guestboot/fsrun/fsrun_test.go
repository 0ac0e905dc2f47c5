package fsrun

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

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

func TestConfigsAreValid(t *testing.T) {
	for _, s := range []guestboot.FSSizes{guestboot.FSSizesCI, guestboot.FSSizesFull} {
		b := FSBench{Sizes: s, Dir: "/d", Root: "/"}
		b.withDefaults()
		for _, system := range guestboot.FSSystems {
			require.NoError(t, b.config(system).Validate(), "%s: %s", system, s)
		}
	}
}

// guestFiles returns the test guest's kernel and initramfs
// (guestboot.EnvKernel and EnvInitrd, which the harness sets; else the
// build cache and one built here), skipping unless this host's KVM boots
// Linux (testharness/nested's TestNestedFSBench runs TestFSBench in the
// harness elsewhere).
func guestFiles(t *testing.T) (kernelPath, initrd string) {
	t.Helper()
	nested.RequireLinuxBoot(t, "testharness/nested TestNestedFSBench")
	kernelPath, initrd = os.Getenv(guestboot.EnvKernel), os.Getenv(guestboot.EnvInitrd)
	if kernelPath == "" {
		var err error
		if kernelPath, err = kernel.Find(kernel.Guest); err != nil {
			t.Skipf("no guest kernel: %v", err)
		}
	}
	if initrd == "" {
		initrd = filepath.Join(t.TempDir(), "initrd.cpio.gz")
		require.NoError(t, guestboot.BuildInitramfs(context.Background(), initrd))
	}
	return kernelPath, initrd
}

func TestBlockSystems(t *testing.T) {
	b := FSBench{Dir: t.TempDir(), Root: "/", Sizes: guestboot.FSSizesCI, NoQemu: true}
	b.withDefaults()
	c := b.config(guestboot.FSQemuBlk)
	require.Equal(t, fsbench.BlockWorkloads, c.Workloads, "only the raw-disk workloads")
	require.Equal(t, fsbench.Mount{Type: fsbench.TypeBlock, Tag: "vda"}, c.Data)
	require.Empty(t, c.Root.Type)
	require.Empty(t, b.Unavailable(guestboot.FSOursBlk))
	require.Equal(t, "no qemu peer here", b.Unavailable(guestboot.FSQemuBlk))

	b.Workloads = []string{fsbench.WorkloadWalk}
	require.Contains(t, b.Unavailable(guestboot.FSOursBlk), "runs on a raw disk")
	require.Len(t, b.Workloads, 1, "config leaves the fs systems' workloads alone")

	b = FSBench{Dir: t.TempDir(), Sizes: guestboot.FSSizesCI, Workloads: fsbench.BlockWorkloads}
	_, err := b.Prepare(context.Background())
	require.NoError(t, err)
	require.NoDirExists(t, filepath.Join(b.Dir, fsbench.TreeDir), "no tree without walk or git")

	image := filepath.Join(b.Dir, fsbench.FileName)
	require.NoError(t, os.WriteFile(image, []byte("old"), 0o644))
	require.NoError(t, makeImage(image, 3))
	st, err := os.Stat(image)
	require.NoError(t, err)
	require.Equal(t, int64(3<<20), st.Size())
	data, err := os.ReadFile(image)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 3<<20), data, "made afresh: zeros")
}

func TestPrepareLeavesOutWhatCannotRun(t *testing.T) {
	b := FSBench{Dir: t.TempDir(), Sizes: guestboot.FSSizes{Runs: 1, MiB: 1, RandReads: 1, Dirs: 2, FilesPerDir: 3}}
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
	b := FSBench{Dir: t.TempDir(), Root: "/", Sizes: guestboot.FSSizes{Runs: 1, MiB: 1, RandReads: 1, Dirs: 2, FilesPerDir: 3}}
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
// the test guest shares the same directory and the host's root on each,
// and the block-device systems each get a raw disk image made in that
// directory (EnvFSSystems=ours-blk,qemu-blk measures them alone).
// It prints an FSFIGURE line per system, run and workload (FSSKIP for a
// system that cannot run); testharness/nested's TestNestedFSBench runs it
// inside the nested harness and reports the medians and speed-ups. It
// fails when a guest reports an error, except qemu + virtiofsd's (the
// reference daemon may not run everywhere: its row is then left out).
func TestMarkSink(t *testing.T) {
	var got []Mark
	s := &markSink{system: guestboot.FSQemuVirtiofsd, onMark: func(m Mark) { got = append(got, m) }}
	begin, end := fsbench.MarkLine("seq_read", true)+"\r\n", fsbench.MarkLine("seq_read", false)+"\r\n"
	_, _ = s.Write([]byte(begin)) // before qemu's pid is known: no mark
	require.Empty(t, got)
	s.setPIDs(10, 11)
	_, _ = s.Write([]byte("boot noise\n" + begin[:7]))
	_, _ = s.Write([]byte(begin[7:] + "TESTINIT FS workload=seq bytes=1\n" + end))
	require.Equal(t, []Mark{
		{System: guestboot.FSQemuVirtiofsd, Metric: "seq_read", Begin: true, PIDs: []int{10, 11}},
		{System: guestboot.FSQemuVirtiofsd, Metric: "seq_read", Begin: false, PIDs: []int{10, 11}},
	}, got, "a mark split across writes is one mark; other lines are none")
	_, _ = s.Write([]byte(strings.Repeat("x", 10000) + "\n")) // a long line is bounded, and no mark
	require.Len(t, got, 2)
}

func TestFSBench(t *testing.T) {
	kernel, initrd := guestFiles(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	sizes, err := guestboot.FSSizesFromEnv()
	require.NoError(t, err)
	t.Logf("fs bench: %s", sizes)
	logger := slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b := &FSBench{Kernel: kernel, Initrd: initrd, Dir: t.TempDir(), Root: "/", Sizes: sizes, Logger: logger}
	if !slices.ContainsFunc(guestboot.FSSuiteFS.Systems, Selected) {
		b.Workloads = fsbench.BlockWorkloads // no tree, git or python to set up
	}
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
	for _, s := range guestboot.FSSystems {
		if !Selected(s) {
			continue
		}
		if why := b.Unavailable(s); why != "" {
			t.Log(guestboot.FSSkipLine(s, why))
			continue
		}
		systems = append(systems, s)
	}
	for run := 1; run <= sizes.Runs; run++ {
		for _, system := range slices.Clone(systems) {
			res, err := b.Run(context.Background(), system, run)
			if system == guestboot.FSQemuVirtiofsd && err != nil {
				t.Log(guestboot.FSSkipLine(system, firstLine(err.Error())))
				t.Logf("%s run %d: %v", system, run, err)
				systems = slices.DeleteFunc(systems, func(s string) bool { return s == system })
				continue
			}
			require.NoError(t, err, "%s, run %d", system, run)
			t.Logf("%s run %d: outer machine busy %v of %v from ready to end; %d KVM_RUNs, %d MMIO exits",
				system, run, res.Busy, res.Window.Round(time.Millisecond), res.Exits.Runs, res.Exits.MMIOExits)
			for _, f := range res.Figures() {
				t.Log(f.FigureLine())
				if f.Result.Err != "" && system != guestboot.FSQemuVirtiofsd {
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
