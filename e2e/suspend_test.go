package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// Log lines of the helper the suspend tests go by.
const (
	logSuspended = "guest suspended"
	logResumed   = "guest resumed"
)

// suspendedFiles are a profile's suspended state (helper/backend/vm).
var suspendedFiles = []string{"suspended.snap", "suspended.json"}

// TestKVMSuspendResume: stopVM saves the guest, and the next startVM
// resumes it instead of booting (issue #43).
//   - A change to the root (the root disk) made before the stop is there.
//   - Host files edited while the guest was saved are seen new: one in a
//     system directory (the helper runs with a tmpfs of its own on /opt,
//     in a mount namespace of its own), edited in place and replaced,
//     and one in a user mount.
//   - The resumed guest has a boot id of its own.
//   - A state is used once, only by its own profile, and only by a VM of
//     its shape: a start with another memory size boots.
//   - A helper killed with its guest running leaves no state: the next
//     start boots, with the journal replayed and the change kept.
//
// TestNestedKVMSuspend runs it where this KVM cannot boot Linux.
func TestKVMSuspendResume(t *testing.T) {
	backend := kvmBackend(t, "TestNestedKVMSuspend")
	wrap := ownOptWrapper(t)
	dirs := newHelperDirs(t, backend)
	h := dirs.startWith(t, wrap)
	opt := filepath.Join("/proc", strconv.Itoa(h.cmd.Process.Pid), "root", "opt")
	writeFile(t, filepath.Join(opt, "edited"), "sys-v1\n")
	writeFile(t, filepath.Join(opt, "replaced"), "sys-v1\n")
	user := t.TempDir()
	writeFile(t, filepath.Join(user, "note"), "user-v1\n")
	mounts := map[string]any{"work": map[string]any{"path": strings.TrimPrefix(user, "/"), "mode": "rw"}}

	a := profilePipe(t, h.socket, "sus-A")
	evA := subscribeProfile(t, h.socket, "sus-A")
	a.call("createVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "diskSizeGB": 1}, nil)
	bootProfile(t, a, "sus-A")
	profileDir := onlyProfileDir(t, h, "sus-A")
	look := `cat /opt/edited /opt/replaced /sessions/w/mnt/work/note; cat /usr/local/share/cowork-suspend 2>/dev/null || echo no-root-change`
	spawnLook(t, a, evA, "before", mounts, "echo kept | sudo tee /usr/local/share/cowork-suspend >/dev/null; "+look)
	assert.Equal(t, "sys-v1\nsys-v1\nuser-v1\nkept\n", evA.output("stdout", "before"))

	spawnLook(t, a, evA, "boot-id", nil, "cat /proc/sys/kernel/random/boot_id")
	bootID := evA.output("stdout", "boot-id")
	require.Len(t, strings.TrimSpace(bootID), 36, "a boot id")

	stopped := time.Now()
	a.call("stopVM", nil, nil)
	t.Logf("stopVM with the save: %v", time.Since(stopped))
	waitLog(t, h, logSuspended)
	for _, f := range suspendedFiles {
		st, err := os.Stat(filepath.Join(profileDir, f))
		require.NoError(t, err, "the suspended state is in the profile's directory")
		assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), f)
	}
	writeFile(t, filepath.Join(opt, "edited"), "sys-v2\n")
	writeFile(t, filepath.Join(opt, ".new"), "sys-v2-replaced\n")
	require.NoError(t, os.Rename(filepath.Join(opt, ".new"), filepath.Join(opt, "replaced")))
	writeFile(t, filepath.Join(user, "note"), "user-v2\n")

	b := profilePipe(t, h.socket, "sus-B") // another profile: boots, never A's state
	evB := subscribeProfile(t, h.socket, "sus-B")
	bootProfile(t, b, "sus-B")
	spawnLook(t, b, evB, "b-look", nil, `cat /usr/local/share/cowork-suspend 2>/dev/null || echo no-root-change`)
	assert.Equal(t, "no-root-change\n", evB.output("stdout", "b-look"))
	assert.Equal(t, 0, strings.Count(h.stderr.String(), logResumed), "B does not resume A's guest")
	b.call("stopVM", nil, nil)

	started := time.Now()
	bootProfile(t, a, "sus-A")
	t.Logf("startVM → connected, resumed: %v", time.Since(started))
	require.Equal(t, 1, strings.Count(h.stderr.String(), logResumed), "A's guest was resumed")
	for _, f := range suspendedFiles {
		assert.NoFileExists(t, filepath.Join(profileDir, f), "a state is spent by its resume")
	}
	spawnLook(t, a, evA, "boot-id-resumed", nil, "cat /proc/sys/kernel/random/boot_id")
	resumedID := evA.output("stdout", "boot-id-resumed")
	assert.Len(t, strings.TrimSpace(resumedID), 36, "a boot id")
	assert.NotEqual(t, bootID, resumedID, "a resumed guest has a boot id of its own")
	spawnLook(t, a, evA, "after", mounts, look)
	assert.Equal(t, "sys-v2\nsys-v2-replaced\nuser-v2\nkept\n", evA.output("stdout", "after"),
		"host files edited while the guest was saved are seen new; stderr %q", evA.output("stderr", "after"))

	// Another memory size: the state does not fit, the guest boots.
	a.call("stopVM", nil, nil)
	waitLog(t, h, logSuspended)
	a.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "memoryGB": 1.5, "cpuCount": 1}, nil)
	waitConnected(t, a)
	assert.Equal(t, 1, strings.Count(h.stderr.String(), logResumed), "a state of another memory size is not resumed")
	spawnLook(t, a, evA, "resized", mounts, look)
	assert.Equal(t, "sys-v2\nsys-v2-replaced\nuser-v2\nkept\n", evA.output("stdout", "resized"))

	// A helper killed with its guest running leaves no state.
	spawnLook(t, a, evA, "write", nil, "echo after-kill | sudo tee /usr/local/share/cowork-suspend-kill >/dev/null; sync; echo ok")
	require.NoError(t, h.cmd.Process.Kill())
	<-h.exited
	for _, f := range suspendedFiles {
		assert.NoFileExists(t, filepath.Join(profileDir, f), "no state after a helper was killed")
	}
	h2 := dirs.startWith(t, wrap)
	a = profilePipe(t, h2.socket, "sus-A")
	evA = subscribeProfile(t, h2.socket, "sus-A")
	bootProfile(t, a, "sus-A")
	assert.NotContains(t, h2.stderr.String(), logResumed, "the start after a killed helper boots")
	spawnLook(t, a, evA, "after-kill", nil, `cat /usr/local/share/cowork-suspend /usr/local/share/cowork-suspend-kill`)
	assert.Equal(t, "kept\nafter-kill\n", evA.output("stdout", "after-kill"), "nothing lost; stderr %q", evA.output("stderr", "after-kill"))
	a.call("stopVM", nil, nil)
	recordBoot(t)
}

// TestNestedKVMSuspend runs TestKVMSuspendResume and
// TestKVMSuspendFigures in the nested harness (see
// TestNestedKVMClientFlow) and records the figures.
func TestNestedKVMSuspend(t *testing.T) {
	var env []string
	if n := os.Getenv(suspendRoundsEnv); n != "" {
		env = append(env, suspendRoundsEnv+"="+n)
	}
	res := nested.RunGoTestWith(t, nestedKVMTest(t, "^(TestKVMSuspendResume|TestKVMSuspendFigures)$", 30*time.Minute, 1, env...))
	figures := nested.FiguresIn(res.Output, suspendFiguresMarker)
	if len(figures) == 0 {
		t.Error("the suspend figures measured nothing inside the nested guest (skipped there?)")
	}
	nested.RecordFigures(t, figures...)
}

// spawnLook runs script in session w of c and waits for its exit, which
// must be 0; mounts (may be nil) are the spawn's additionalMounts.
func spawnLook(t *testing.T, c *client, ev *events, id string, mounts map[string]any, script string) {
	t.Helper()
	c.call("spawn", map[string]any{"id": id, "name": "w", "command": "/bin/sh", "args": sh(script), "additionalMounts": mounts}, nil)
	exit, err := ev.tryWait("exit of "+id, 4*time.Minute, func(e protocol.Event) bool { return e.Type == protocol.EventExit && e.ID == id })
	require.NoError(t, err)
	require.NotNil(t, exit.ExitCode, "%s: %+v; stderr %q", id, exit, ev.output("stderr", id))
	require.Equal(t, 0, *exit.ExitCode, "%s; stderr %q", id, ev.output("stderr", id))
}

// onlyProfileDir is the one directory of profile name in h's data.
func onlyProfileDir(t *testing.T, h *harness, name string) string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(h.dataDir, "cowork-vmm", "profiles", name+"-*"))
	require.NoError(t, err)
	require.Len(t, dirs, 1, "profile %s's directory", name)
	return dirs[0]
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

// ownOptWrapper is a command prefix that runs the helper in a mount
// namespace of its own with an empty tmpfs on /opt, which the test writes
// through /proc/<pid>/root (a system directory it may edit without
// touching the host's). It skips without root, /opt or unshare(1).
func ownOptWrapper(t *testing.T) []string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the helper gets a /opt of its own in a mount namespace")
	}
	if _, err := os.Stat("/opt"); err != nil {
		t.Skip("the host has no /opt (a system directory the guest shares)")
	}
	wrap := []string{"unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`mount -t tmpfs -o mode=0755 cowork-e2e-opt /opt && exec "$@"`, "sh"}
	if out, err := exec.Command(wrap[0], append(wrap[1:], "true")...).CombinedOutput(); err != nil {
		t.Skipf("cannot give the helper a /opt of its own (%v): %s", err, out)
	}
	return wrap
}

// suspendFiguresMarker starts every figure line TestKVMSuspendFigures
// records.
const suspendFiguresMarker = "suspend and resume: "

// suspendRoundsEnv sets TestKVMSuspendFigures' rounds (default 3 in CI;
// the figures are 10).
const suspendRoundsEnv = "COWORK_VMM_BENCH_SUSPEND_ROUNDS"

// TestKVMSuspendFigures measures, in the same run and interleaved, a
// helper that suspends its guest at stopVM beside one with snapshots off
// (COWORK_VMM_SNAPSHOT=off: every start boots and sets up): startVM →
// connected (isGuestConnected polled every 10 ms), stopVM → done (the
// save included), and the suspended state's size on disk. Each start is followed by a spawn, so that the guest is
// used as the client uses it. It asserts that every resume was one
// (logged by the helper) and records the figures.
func TestKVMSuspendFigures(t *testing.T) {
	backend := kvmBackend(t, "TestNestedKVMSuspend")
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv(suspendRoundsEnv)); err == nil && n > 0 {
		rounds = n
	}
	type side struct {
		name          string
		h             *harness
		c             *client
		ev            *events
		start, stop   []time.Duration
		sizes         []int64
		resumedBefore int
	}
	sides := []*side{{name: "suspended"}, {name: "snapshots off"}}
	sides[0].h = startHelper(t, backend)
	sides[1].h = startHelper(t, backend, "COWORK_VMM_SNAPSHOT=off")
	for _, s := range sides {
		s.c = profilePipe(t, s.h.socket, "fig")
		s.ev = subscribeProfile(t, s.h.socket, "fig")
		s.c.call("createVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "diskSizeGB": 1}, nil)
		bootProfile(t, s.c, "fig") // formats the disk: not a figure
		s.c.call("stopVM", nil, nil)
	}
	for round := range rounds {
		for _, s := range sides {
			began := time.Now()
			s.c.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "memoryGB": 1.0, "cpuCount": 1}, nil)
			waitConnectedEvery(t, s.c, 10*time.Millisecond)
			s.start = append(s.start, time.Since(began))
			spawnLook(t, s.c, s.ev, fmt.Sprintf("r%d", round), nil, "true")
			began = time.Now()
			s.c.call("stopVM", nil, nil)
			s.stop = append(s.stop, time.Since(began))
			if s == sides[0] {
				require.Equal(t, round+1, strings.Count(s.h.stderr.String(), logResumed), "round %d resumed", round)
				waitLog(t, s.h, logSuspended)
				s.sizes = append(s.sizes, allocatedSize(t, filepath.Join(onlyProfileDir(t, s.h, "fig"), suspendedFiles[0])))
			}
		}
	}
	sus, off := sides[0], sides[1]
	assert.Zero(t, strings.Count(off.h.stderr.String(), logSuspended), "snapshots off: nothing is suspended")
	slices.Sort(sus.sizes)
	nested.RecordFigures(t,
		fmt.Sprintf("%sstartVM → connected, resumed %v against booted %v: %.2f× (%s / %s, %d rounds)", suspendFiguresMarker,
			ms(median(sus.start)), ms(median(off.start)), ratio(median(sus.start), median(off.start)), durations(sus.start), durations(off.start), rounds),
		fmt.Sprintf("%sstopVM, suspending %v against shutting down %v: %.2f× (%s / %s)", suspendFiguresMarker,
			ms(median(sus.stop)), ms(median(off.stop)), ratio(median(sus.stop), median(off.stop)), durations(sus.stop), durations(off.stop)),
		fmt.Sprintf("%ssuspended state on disk: %.1f MiB (median of %d; 1 GiB guest)", suspendFiguresMarker,
			float64(sus.sizes[len(sus.sizes)/2])/(1<<20), len(sus.sizes)))
	recordBoot(t)
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

// allocatedSize is the disk space a file takes.
func allocatedSize(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return st.Blocks * 512
}
