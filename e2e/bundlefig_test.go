package e2e

import (
	"fmt"
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

// benchTreeFiles is how many files the git-status tree holds. Issue #41
// asks for 10 000; under the nested harness's emulator making and
// committing 2 000 takes 15-18 s per boot, and each of the four boots
// makes its tree (/tmp is not kept), so 10 000 would add some 6 minutes
// to CI: the tree holds 2 000. (In the session directory, writing 10 000
// files alone took 6.4 minutes.)
const benchTreeFiles = 2000

// benchRounds is how many times each userland boots, alternating
// (bundle, host dirs, bundle, …).
const benchRounds = 2

// benchStepTimeout bounds one timed step; making and committing the tree
// under the nested harness's emulator takes minutes.
const benchStepTimeout = 8 * time.Minute

// TestKVMBundleFigures measures, in one helper, the bundle's userland
// (the stand-in image: ext4 over virtio-blk through the copy-on-write
// layer) beside the host directories' (virtio-fs), booting each in turn
// (issue #41's bench rows): startVM → connected, `python3 -c pass` first
// in the boot (cold) and again (warm), and `git status` of a
// benchTreeFiles-file tree in the session's /tmp, after dropping the
// guest's caches (cold, where sudo can) and again (warm). Every time is the client's:
// the call or spawn to the event that ends it. It records figures and
// asserts only that each step succeeded. TestNestedKVMBundle runs it.
func TestKVMBundleFigures(t *testing.T) {
	backend := kvmBackend(t, "TestNestedKVMBundle")
	b := bundle.Require(t)
	h := startHelper(t, backend)
	userlands := []benchUserland{
		{name: "bundle", profile: "fig-bundle", bundlePath: b.Dir},
		{name: "host dirs", profile: "fig-hostdirs", bundlePath: filepath.Join(t.TempDir(), "no-bundle")},
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
	c                         *client
	ev                        *events
	seq                       int // numbers spawn ids
}

// benchRowOrder is the order figure lines come in.
var benchRowOrder = []string{"startVM → connected", "python3 -c pass (cold)", "python3 -c pass (warm)",
	"git status " + strconv.Itoa(benchTreeFiles) + " files (cold)", "git status " + strconv.Itoa(benchTreeFiles) + " files (warm)"}

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
	// The session's /tmp is not kept across stopVM: each boot makes the
	// tree, then drops the guest's caches for the cold git status.
	made, _ := u.run(t, makeBenchTree)
	t.Logf("%s: made and committed the %d-file tree in %v (boot %d)", u.name, benchTreeFiles, ms(made), round+1)
	if _, dropped := u.run(t, dropCaches); dropped == "dropped\n" {
		got[benchRowOrder[3]], _ = u.gitStatus(t)
	} else {
		t.Logf("%s: no cold git status, the guest's caches were not dropped: %q", u.name, u.ev.output(protocol.EventStderr, fmt.Sprintf("bench-%d", u.seq)))
	}
	var out string
	got[benchRowOrder[4]], out = u.gitStatus(t)
	require.Equal(t, "clean\n", out, "%s: git status of the committed tree", u.name)
	u.c.call("stopVM", nil, nil)
	return got
}

// dropCaches asks the guest kernel to drop its page, dentry and inode
// caches, through the session's sudo; it says "dropped" if it could.
// Today it cannot (sudo's root is a user namespace's: "cannot create
// /proc/sys/vm/drop_caches: Permission denied"), so the cold row is
// missing until the agent offers a way; the test logs why.
const dropCaches = `sync; sudo sh -c 'echo 3 > /proc/sys/vm/drop_caches' && echo dropped || true`

// benchTreeDir is where the tree is made: the session's /tmp, not its
// directory, where git cannot run (access(2) there answers EACCES to the
// spawn's uid: git init dies "Cannot access work tree", git add "unable
// to access .git/config"; seen in the nested harness, to be fixed apart).
const benchTreeDir = "/tmp/bench-tree"

// makeBenchTree makes and commits the tree: one python3 writes the files
// (a shell loop would fork benchTreeFiles times under the emulator).
var makeBenchTree = benchGitEnv + `set -e
rm -rf ` + benchTreeDir + `
mkdir -p ` + benchTreeDir + ` && cd ` + benchTreeDir + `
python3 -c '
import os
for i in range(` + strconv.Itoa(benchTreeFiles) + `):
    d = "d%03d" % (i // 100)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d.txt" % i), "w") as f:
        f.write("file %d\n" % i)
'
git init -q .
git add .
git -c user.name=bench -c user.email=bench@example.invalid commit -q -m tree`

// benchGitEnv lets git use the tree whatever owner the share shows it to
// the spawn's uid (git refuses a repository another uid owns).
const benchGitEnv = `export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'
`

// benchTreeClean says whether the tree is clean.
const benchTreeClean = benchGitEnv + `cd ` + benchTreeDir + ` && test -z "$(git status --porcelain)" && echo clean`

// run spawns script in the bench session, requires exit 0 and returns the
// time from the spawn call to the exit event's arrival, and its stdout.
func (u *benchUserland) run(t *testing.T, script string) (time.Duration, string) {
	t.Helper()
	id := u.nextID()
	start := time.Now()
	u.c.call("spawn", map[string]any{"id": id, "name": "bench", "command": "/bin/sh", "args": sh(script)}, nil)
	end := u.exitOK(t, id)
	return end.Sub(start), u.ev.output(protocol.EventStdout, id)
}

// nextID is a spawn id not used before in u's profile.
func (u *benchUserland) nextID() string {
	u.seq++
	return fmt.Sprintf("bench-%d", u.seq)
}

// gitStatus times `git status` alone, then checks the tree is clean in
// a second, untimed spawn, whose stdout it returns.
func (u *benchUserland) gitStatus(t *testing.T) (time.Duration, string) {
	t.Helper()
	id := u.nextID()
	start := time.Now()
	u.c.call("spawn", map[string]any{"id": id, "name": "bench", "command": "/bin/sh",
		"args": sh(benchGitEnv + `cd ` + benchTreeDir + ` && exec git status`)}, nil)
	end := u.exitOK(t, id)
	check := id + "-check"
	u.c.call("spawn", map[string]any{"id": check, "name": "bench", "command": "/bin/sh", "args": sh(benchTreeClean)}, nil)
	u.exitOK(t, check)
	return end.Sub(start), u.ev.output(protocol.EventStdout, check)
}

// exitOK waits for id's exit, requires status 0 and returns when it came.
func (u *benchUserland) exitOK(t *testing.T, id string) time.Time {
	t.Helper()
	exit, err := u.ev.tryWait("exit of "+id, benchStepTimeout, func(e protocol.Event) bool { return e.Type == protocol.EventExit && e.ID == id })
	stdout, stderr := u.ev.output(protocol.EventStdout, id), u.ev.output(protocol.EventStderr, id)
	require.NoError(t, err, "%s: stdout %q, stderr %q", u.name, stdout, stderr)
	require.NotNil(t, exit.ExitCode, "%s %s: %+v, stderr %q", u.name, id, exit, stderr)
	require.Equal(t, 0, *exit.ExitCode, "%s %s: stdout %q, stderr %q", u.name, id, stdout, stderr)
	at, _ := u.ev.firstAt(id, func(e protocol.Event) bool { return e.Type == protocol.EventExit })
	return at
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
