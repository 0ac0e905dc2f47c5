package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Issue #18's guest side, driven as the desktop client does: guest
// requests (a spawned `cowork-vmm guest-request` asking the client, the
// client answering with sendGuestResponse), and spawn's isResume, oneShot
// and mountSkeletonHome, and the exits' oomKillCount.

// TestGuestRequest: on COWORK_VMM_E2E_BACKEND (the process backend by
// default), see guestRequest.
func TestGuestRequest(t *testing.T) { guestRequest(t, e2eBackend(t)) }

// TestKVMGuestRequest is TestGuestRequest on the kvm backend, where the
// asking process is isolated (its socket in its own /run);
// TestNestedKVMContract runs it in the harness where this KVM cannot boot
// Linux.
func TestKVMGuestRequest(t *testing.T) {
	guestRequest(t, kvmBackend(t, "TestNestedKVMContract"))
	recordBoot(t)
}

// TestSpawnFlags: on COWORK_VMM_E2E_BACKEND, see spawnFlags.
func TestSpawnFlags(t *testing.T) { spawnFlags(t, e2eBackend(t)) }

// TestKVMSpawnFlags is TestSpawnFlags on the kvm backend, with a spawn
// that meets the OOM killer in its cgroup and reports it.
func TestKVMSpawnFlags(t *testing.T) {
	spawnFlags(t, kvmBackend(t, "TestNestedKVMContract"))
	recordBoot(t)
}

// TestNestedKVMContract runs the kvm forms of the contract tests
// (TestKVMGuestRequest, TestKVMSpawnFlags, TestKVMContract*) inside the
// nested harness, like TestNestedKVMClientFlow.
func TestNestedKVMContract(t *testing.T) {
	runNestedKVM(t, "^(TestKVMGuestRequest|TestKVMSpawnFlags|TestKVMContract.*)$", 25*time.Minute)
}

// bootGuest starts the helper on backend, configures a profile on a pipe
// as the client does, subscribes to its events and boots its guest.
func bootGuest(t *testing.T, backend, profile string) (*client, *events) {
	t.Helper()
	h := startHelper(t, backend)
	c := profilePipe(t, h.socket, profile)
	ev := subscribeProfile(t, h.socket, profile)
	bootProfile(t, c, profile)
	return c, ev
}

// askFrom spawns `cowork-vmm guest-request args...` in session, as a tool
// inside the guest runs it, and returns the request event it causes.
func askFrom(t *testing.T, h *client, ev *events, id, session string, args ...string) protocol.Event {
	t.Helper()
	seen := len(requestsOf(ev))
	h.call("spawn", map[string]any{"id": id, "name": session, "command": protocol.GuestToolPath,
		"args": append([]string{"guest-request"}, args...)}, nil)
	ev.wait("a request from "+id, func(e protocol.Event) bool {
		if e.Type == protocol.EventExit && e.ID == id {
			t.Fatalf("%s exited without asking: %+v, stderr %q", id, e, ev.outputLocked(protocol.EventStderr, id))
		}
		return len(requestsOfLocked(ev)) > seen
	})
	return requestsOf(ev)[seen]
}

// requestsOf lists the request events so far.
func requestsOf(ev *events) []protocol.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return requestsOfLocked(ev)
}

func requestsOfLocked(ev *events) []protocol.Event {
	var out []protocol.Event
	for _, e := range ev.all {
		if e.Type == protocol.EventRequest {
			out = append(out, e)
		}
	}
	return out
}

// guestRequest: a spawned process's guest-request call reaches the client
// as a request event of its profile (an integer id, the method, the params
// as sent); the client's sendGuestResponse with the id as a JSON number is
// the command's output (exit 0), an error answer its exit status 1; a call
// the client leaves unanswered past its timeout fails, and its id, like one
// never asked, is refused.
func guestRequest(t *testing.T, backend string) {
	h, ev := bootGuest(t, backend, "guest-request")
	start := time.Now()

	req := askFrom(t, h, ev, "asker", "gr", "askUser", `{"question":"proceed?","n":3}`)
	assert.Equal(t, "askUser", req.Method)
	assert.Equal(t, map[string]any{"question": "proceed?", "n": 3.0}, req.Params)
	_, err := strconv.ParseUint(req.ID, 10, 53)
	require.NoError(t, err, "request ids are integers the client can send back as numbers")
	h.call("sendGuestResponse", map[string]any{"id": json.RawMessage(req.ID), "resultJson": `{"answer":"yes"}`}, nil)
	exit := ev.exit("asker")
	require.NotNil(t, exit.ExitCode, "%+v: %s", exit, ev.output(protocol.EventStderr, "asker"))
	assert.Equal(t, 0, *exit.ExitCode, ev.output(protocol.EventStderr, "asker"))
	assert.JSONEq(t, `{"answer":"yes"}`, ev.output(protocol.EventStdout, "asker"))
	resp := h.try("sendGuestResponse", map[string]any{"id": json.RawMessage(req.ID), "resultJson": "{}"})
	assert.False(t, resp.Success, "answered already")

	req = askFrom(t, h, ev, "refused", "gr", "deleteEverything")
	assert.Equal(t, map[string]any{}, req.Params)
	h.call("sendGuestResponse", map[string]any{"id": req.ID, "error": "the user said no"}, nil)
	exit = ev.exit("refused")
	require.NotNil(t, exit.ExitCode)
	assert.Equal(t, 1, *exit.ExitCode)
	assert.Contains(t, ev.output(protocol.EventStderr, "refused"), "the user said no")

	asked := time.Now()
	req = askFrom(t, h, ev, "slow", "gr", "--timeout", "2s", "askUser", `{}`)
	exit = ev.exit("slow")
	require.NotNil(t, exit.ExitCode)
	assert.Equal(t, 1, *exit.ExitCode)
	assert.Contains(t, ev.output(protocol.EventStderr, "slow"), "no response from the client within 2s")
	assert.GreaterOrEqual(t, time.Since(asked), 2*time.Second)
	resp = h.try("sendGuestResponse", map[string]any{"id": json.RawMessage(req.ID), "resultJson": "{}"})
	assert.False(t, resp.Success)
	assert.Contains(t, resp.Error, "timed out")
	resp = h.try("sendGuestResponse", map[string]any{"id": 987654321, "resultJson": "{}"})
	assert.False(t, resp.Success, "an id never asked")
	t.Logf("GUESTREQUEST backend=%s three calls in %v", backend, time.Since(start).Round(time.Millisecond))
	h.call("stopVM", nil, nil)
}

// runIn spawns sh -c script in session with extra spawn params and returns
// its exit and stdout.
func runIn(t *testing.T, h *client, ev *events, id, session, script string, extra map[string]any) (protocol.Event, string) {
	t.Helper()
	params := map[string]any{"id": id, "name": session, "command": "/bin/sh", "args": sh(script)}
	for k, v := range extra {
		params[k] = v
	}
	h.call("spawn", params, nil)
	exit := ev.exit(id)
	stderr := ev.output(protocol.EventStderr, id)
	require.NotNil(t, exit.ExitCode, "%s: %+v: %s", id, exit, stderr)
	require.Equal(t, 0, *exit.ExitCode, "%s: %s", id, stderr)
	return exit, ev.output(protocol.EventStdout, id)
}

// spawnFlags: without isResume a spawn finds only its own mounts in its
// session, with isResume also the earlier spawns' (withdrawn since, or set
// aside by a fresh start), and the home's files either way; a oneShot process's session keeps none of
// its mounts after it; mountSkeletonHome gives the home /etc/skel's files
// and the configuration mounts, read-only as the client asked. Exits carry
// no oomKillCount on the process backend (no cgroup of its own there); on
// the kvm backend a spawn over the spawns' memory limit is OOM-killed and
// its exit says so.
func spawnFlags(t *testing.T, backend string) {
	h, ev := bootGuest(t, backend, "spawn-flags")
	work := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(work, "f"), []byte("host file\n"), 0o644))
	mounts := map[string]any{"work": map[string]string{"path": strings.TrimPrefix(work, "/"), "mode": "ro"}}
	const ls = `ls -A mnt/work 2>/dev/null | tr '\n' ' '; echo`

	exit, out := runIn(t, h, ev, "first", "flags", `echo turn-1 > note; `+ls, map[string]any{"additionalMounts": mounts})
	assert.Equal(t, "f \n", out)
	if backend == "kvm" {
		require.NotNil(t, exit.OOMKillCount, "the kvm backend's spawns have a cgroup")
		assert.Zero(t, *exit.OOMKillCount)
	} else {
		assert.Nil(t, exit.OOMKillCount, "no cgroup of its own on the process backend: no count")
	}
	_, out = runIn(t, h, ev, "resumed", "flags", `cat note; `+ls, map[string]any{"isResume": true})
	assert.Equal(t, "turn-1\nf \n", out, "a resume finds the home and the earlier spawn's mount")
	_, out = runIn(t, h, ev, "fresh", "flags", `cat note; `+ls, nil)
	assert.Equal(t, "turn-1\n\n", out, "a fresh start keeps the home's files, not the earlier mounts")
	_, out = runIn(t, h, ev, "resumed-again", "flags", ls, map[string]any{"isResume": true})
	assert.Equal(t, "f \n", out, "the earlier mounts were set aside, not forgotten")

	_, out = runIn(t, h, ev, "once", "oneshot", ls, map[string]any{"oneShot": true, "additionalMounts": mounts})
	assert.Equal(t, "f \n", out)
	_, out = runIn(t, h, ev, "after-once", "oneshot", ls, map[string]any{"isResume": true})
	assert.Equal(t, "\n", out, "the oneShot process's mounts went with it")

	skills := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(skills, "skill.md"), []byte("a skill\n"), 0o644))
	skel := map[string]any{"mountSkeletonHome": true, "additionalMounts": map[string]any{
		".claude/skills": map[string]string{"path": strings.TrimPrefix(skills, "/"), "mode": "ro"},
		"work":           map[string]string{"path": strings.TrimPrefix(work, "/"), "mode": "ro"},
	}}
	_, out = runIn(t, h, ev, "skel", "skel", `cat "$HOME/.claude/skills/skill.md"; `+
		`(echo x > "$HOME/.claude/skills/new") 2>/dev/null && echo written || echo refused; `+
		`[ -e "$HOME/work" ] && echo work-in-home || echo no-work-in-home; ls -A "$HOME" | tr '\n' ' '; echo`, skel)
	lines := strings.Split(out, "\n")
	require.Len(t, lines, 5, out)
	assert.Equal(t, []string{"a skill", "refused", "no-work-in-home"}, lines[:3])
	for _, name := range skelNames(t) {
		assert.Contains(t, strings.Fields(lines[3]), name, "/etc/skel's %s in the home", name)
	}
	assert.Contains(t, strings.Fields(lines[3]), ".claude")
	assert.NoFileExists(t, filepath.Join(skills, "new"))

	if backend == "kvm" {
		oomKill(t, h, ev)
	}
	h.call("stopVM", nil, nil)
}

// skelNames lists the host's /etc/skel.
func skelNames(t *testing.T) []string {
	entries, err := os.ReadDir("/etc/skel")
	if err != nil {
		t.Logf("no /etc/skel on this host: %v", err)
		return nil
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() || e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

// oomKill runs a spawn that allocates (and writes) memory until the OOM
// killer ends it: the spawns' cgroup is limited below the guest's memory,
// so it is this spawn, in its own cgroup, that is killed, and its exit says
// so.
func oomKill(t *testing.T, h *client, ev *events) {
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Logf("no %s: the OOM case is not run", python)
		return
	}
	h.call("spawn", map[string]any{"id": "hog", "name": "oom", "command": python, "args": []string{"-c",
		"b = []\nwhile True:\n    b.append(b'x' * (16 << 20))\n"}}, nil)
	start := time.Now()
	// Filling the guest's memory a page fault at a time takes a while
	// nested.
	exit, err := ev.tryWait("the exit of hog", 4*time.Minute, func(e protocol.Event) bool { return e.Type == protocol.EventExit && e.ID == "hog" })
	require.NoError(t, err)
	require.NotNil(t, exit.OOMKillCount, "%+v", exit)
	t.Logf("OOMFIGURE hog ended after %v: signal %s, oomKillCount %d", time.Since(start).Round(time.Millisecond), exit.Signal, *exit.OOMKillCount)
	assert.Equal(t, "SIGKILL", exit.Signal, ev.output(protocol.EventStderr, "hog"))
	assert.GreaterOrEqual(t, *exit.OOMKillCount, 1)
	// The guest lives on.
	_, out := runIn(t, h, ev, "after-oom", "oom", "echo alive", nil)
	assert.Equal(t, "alive\n", out)
}
