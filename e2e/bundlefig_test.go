package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/bundle"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// bundleFiguresMarker starts every figure line TestKVMBundleFigures
// records.
const bundleFiguresMarker = "bundle vs host dirs: "

// benchTreeFiles is how many files the git-status tree holds:
// $COWORK_VMM_BENCH_TREE_FILES, else defaultBenchTreeFiles. Issue #41's
// figure is for 10 000 (COWORK_VMM_BENCH_TREE_FILES=10000): nested, each
// git status of those takes about 50 s over virtio-fs (every file's
// attributes are looked up again after their one-second lifetime), and
// the whole test 16 minutes, too long for CI, which runs 2 000. The test
// makes and commits the tree on the host, once.
func benchTreeFiles() int {
	if n, err := strconv.Atoi(os.Getenv(benchTreeFilesEnv)); err == nil && n > 0 && n <= 100000 {
		return n
	}
	return defaultBenchTreeFiles
}

const (
	benchTreeFilesEnv     = "COWORK_VMM_BENCH_TREE_FILES"
	defaultBenchTreeFiles = 2000
)

// benchRounds is how many times each userland boots, alternating
// (bundle, host dirs, bundle, …). The first round's first git status
// refreshes the index the host made (it records the host's view of each
// file's owner), so the first-in-boot row counts from the second round.
const benchRounds = 3

// benchStepTimeout bounds one timed step under the nested harness's
// emulator.
const benchStepTimeout = 8 * time.Minute

// TestKVMBundleFigures measures, in one helper, the bundle's userland
// (the stand-in image: ext4 over virtio-blk through the copy-on-write
// layer) beside the host directories' (virtio-fs), booting each in turn
// (issue #41's bench rows): startVM → connected, `python3 -c pass` first
// in the boot (cold) and again (warm), and `git status` of a
// benchTreeFiles-file repository in the session (a host folder mounted in
// it, as the client mounts the user's), first in the boot (the guest's
// caches empty) and again (warm). Every time is the client's: the call or
// spawn to the event that ends it. It records figures and asserts only
// that each step succeeded. TestNestedKVMBundle runs it.
func TestKVMBundleFigures(t *testing.T) {
	backend := kvmBackend(t, "TestNestedKVMBundle")
	b := bundle.Require(t)
	tree := makeBenchTree(t)
	h := startHelper(t, backend)
	userlands := []benchUserland{
		{name: "bundle", profile: "fig-bundle", bundlePath: b.Dir, tree: tree},
		{name: "host dirs", profile: "fig-hostdirs", bundlePath: filepath.Join(t.TempDir(), "no-bundle"), tree: tree},
	}
	rows := map[string]map[string][]time.Duration{}
	// Deferred: the rows measured before a step failed are still figures.
	defer func() { nested.RecordFigures(t, benchFigures(rows)...) }()
	for round := range benchRounds {
		for i := range userlands {
			u := &userlands[i]
			if u.c == nil {
				u.c = profilePipe(t, h.socket, u.profile)
				u.ev = subscribeProfile(t, h.socket, u.profile)
			}
			for row, d := range u.measure(t, round) {
				if rows[row] == nil {
					rows[row] = map[string][]time.Duration{}
				}
				rows[row][u.name] = append(rows[row][u.name], d)
			}
		}
	}
	recordBoot(t)
}

// benchUserland is one profile of the comparison and how it boots.
type benchUserland struct {
	name, profile, bundlePath string
	tree                      string // the host repository mounted at benchTreeDir
	c                         *client
	ev                        *events
	seq                       int // numbers spawn ids
}

// benchRowOrder is the order figure lines come in.
var benchRowOrder = []string{"startVM → connected", "python3 -c pass (cold)", "python3 -c pass (warm)",
	"git status " + strconv.Itoa(benchTreeFiles()) + " files (first in the boot)", "git status " + strconv.Itoa(benchTreeFiles()) + " files (warm)"}

// measure boots u once, times its steps and stops it.
func (u *benchUserland) measure(t *testing.T, round int) map[string]time.Duration {
	t.Helper()
	got := map[string]time.Duration{}
	u.c.call("configure", map[string]any{"userDataName": u.profile, "userDataRoot": contractRoot, "networkDrives": []any{}, "memoryMB": 1024, "cpuCount": 1}, nil)
	started := time.Now()
	u.c.call("startVM", map[string]any{"bundlePath": u.bundlePath, "memoryGB": 1.0, "cpuCount": 1}, nil)
	waitConnected(t, u.c)
	got[benchRowOrder[0]] = time.Since(started)
	got[benchRowOrder[1]], _ = u.run(t, `python3 -c pass`)
	got[benchRowOrder[2]], _ = u.run(t, `python3 -c pass`)
	first, out := u.gitStatus(t)
	require.Empty(t, out, "%s: git status of the committed tree", u.name)
	if round > 0 {
		got[benchRowOrder[3]] = first
	}
	got[benchRowOrder[4]], out = u.gitStatus(t)
	require.Empty(t, out, "%s: git status of the committed tree", u.name)
	u.c.call("stopVM", nil, nil)
	return got
}

// benchTreeDir is where the tree is mounted in the bench session.
const benchTreeDir = "/sessions/bench/mnt/tree"

// makeBenchTree makes a repository of benchTreeFiles files, 100 to a
// directory, committed, on the host (git must be on its PATH).
func makeBenchTree(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skipf("the bench repository is made with the host's git: %v", err)
	}
	dir := t.TempDir()
	for i := range benchTreeFiles() {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			require.NoError(t, os.Mkdir(sub, 0o755))
		}
		require.NoError(t, os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%05d.txt", i)), []byte(fmt.Sprintf("file %d\n", i)), 0o644))
	}
	for _, args := range [][]string{{"init", "-q", "."}, {"add", "."}, {"-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "commit", "-q", "-m", "tree"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
	}
	return dir
}

// run spawns script in the bench session, requires exit 0 and returns the
// time from the spawn call to the exit event's arrival, and its stdout.
func (u *benchUserland) run(t *testing.T, script string) (time.Duration, string) {
	t.Helper()
	id := u.nextID()
	start := time.Now()
	u.c.call("spawn", map[string]any{"id": id, "name": "bench", "command": "/bin/sh", "args": sh(script), "additionalMounts": u.mounts()}, nil)
	end := u.ev.exitOK(id, benchStepTimeout)
	return end.Sub(start), u.ev.output(protocol.EventStdout, id)
}

// mounts is every bench spawn's additionalMounts: the tree, read-write
// (git status refreshes the index).
func (u *benchUserland) mounts() map[string]any {
	return map[string]any{"tree": map[string]string{"path": strings.TrimPrefix(u.tree, "/"), "mode": "rw"}}
}

// nextID is a spawn id not used before in u's profile.
func (u *benchUserland) nextID() string {
	u.seq++
	return fmt.Sprintf("bench-%d", u.seq)
}

// gitStatus times `git status --porcelain` in the tree and returns its
// stdout: empty for the clean tree.
func (u *benchUserland) gitStatus(t *testing.T) (time.Duration, string) {
	t.Helper()
	return u.run(t, `cd `+benchTreeDir+` && exec git status --porcelain`)
}

// benchFigures is one line per row: each userland's times in boot order
// and the ratio of their medians, bundle / host dirs.
func benchFigures(rows map[string]map[string][]time.Duration) []string {
	var lines []string
	for _, row := range benchRowOrder {
		b, d := rows[row]["bundle"], rows[row]["host dirs"]
		if len(b) == 0 || len(d) == 0 {
			continue
		}
		ratio := float64(median(b)) / float64(median(d))
		lines = append(lines, fmt.Sprintf("%s%s: bundle %s, host dirs %s, bundle/host dirs %.2f",
			bundleFiguresMarker, row, durations(b), durations(d), ratio))
	}
	return lines
}

// median of ds (the upper one of an even count).
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// durations lists ds rounded to the millisecond, "a / b".
func durations(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = ms(d).String()
	}
	return strings.Join(parts, " / ")
}
