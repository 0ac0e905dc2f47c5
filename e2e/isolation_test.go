package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
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

// isolationProbePath is the hostile spawn's script, shared with the agent's
// own test (TestChildAgentIsolatesSessions); tests run in their package's
// directory, in the nested harness too.
var isolationProbePath = filepath.Join("..", "guest", "agent", "testdata", "isolation_probe.py")

// TestSpawnIsolation drives the built binary as the desktop client does,
// with two sessions each running a process, and checks from inside the
// guest what a hostile spawn of one session can reach, on
// COWORK_VMM_E2E_BACKEND (the process backend by default). The process
// backend guarantees the agent's part (no ptrace of it, no /proc/1/mem,
// environ, fd or root), no 9p or virtiofs mount, no egress token in a spawn's
// environment, working user namespaces, and the spawn's own session and
// mounts; what it does not (another session's files and processes: one uid,
// one mount tree for all) is only logged. TestKVMSpawnIsolation asserts all.
func TestSpawnIsolation(t *testing.T) { spawnIsolation(t, e2eBackend(t)) }

// TestKVMSpawnIsolation is TestSpawnIsolation on the kvm backend, where each
// session's spawns run as a uid of their own with a root holding only their
// session, and every attempt is refused (TestNestedKVMIsolation runs it in
// the harness where this KVM cannot boot Linux).
func TestKVMSpawnIsolation(t *testing.T) {
	spawnIsolation(t, kvmBackend(t, "TestNestedKVMIsolation"))
	recordBoot(t)
}

// TestNestedKVMIsolation runs TestKVMSpawnIsolation inside the nested
// harness, like TestNestedKVMClientFlow.
func TestNestedKVMIsolation(t *testing.T) {
	runNestedKVM(t, "^TestKVMSpawnIsolation$", 12*time.Minute)
}

func spawnIsolation(t *testing.T, backend string) {
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("%s runs the hostile spawn in the guest: %v", python, err)
	}
	probe, err := os.ReadFile(isolationProbePath)
	require.NoError(t, err)
	kvm := backend == "kvm"

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("isolated egress answer for " + r.URL.Path + "\n"))
	}))
	defer srv.Close()
	port := strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)

	h := startHelper(t, backend)
	const profile, root = "isolation", "/home/e2e/.config/Claude"
	pipe, err := protocol.DialPipe(t.Context(), h.socket)
	require.NoError(t, err)
	defer pipe.Close()
	h.pipe = pipe
	h.call("configure", map[string]any{"userDataName": profile, "userDataRoot": root, "sessionOnly": true}, nil)
	ev := subscribe(t, h.socket, map[string]any{"userDataName": profile, "userDataRoot": root})
	start := time.Now()
	h.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "memoryGB": 1.0, "cpuCount": 1}, nil)
	waitConnected(t, h.client)
	t.Logf("ISOLATIONFIGURE backend=%s startVM_to_connected=%v", backend, time.Since(start).Round(time.Millisecond))

	// Session B's process: it leaves its pid and uid in its session, then
	// waits for a mount that mountPath adds while it runs.
	const own, other = "iso-a", "iso-b"
	late := "/sessions/" + other + "/mnt/late/f"
	h.call("spawn", map[string]any{"id": "victim", "name": other, "command": "/bin/sh", "args": []string{"-c",
		`echo "$$ $(id -u)" > /sessions/` + other + `/victim; echo b-secret > /sessions/` + other + `/secret; echo ready; ` +
			`while [ ! -e ` + late + ` ]; do sleep 0.1; done; cat ` + late + `; exec sleep 1000`},
		"allowedDomains": []string{"allowed.test"}}, nil)
	ev.wait("victim ready", func(protocol.Event) bool {
		return strings.Contains(ev.outputLocked(protocol.EventStdout, "victim"), "ready")
	})
	sessions := filepath.Join(h.dataDir, "cowork-vmm", "sessions")
	raw, err := os.ReadFile(filepath.Join(sessions, other, "victim"))
	require.NoError(t, err)
	var victimPID, victimUID int
	_, err = fmt.Sscan(string(raw), &victimPID, &victimUID)
	require.NoError(t, err)

	// Session A's process: the probe, with an rw and an ro mount.
	host := t.TempDir()
	work, roDir := filepath.Join(host, "work"), filepath.Join(host, "readonly")
	require.NoError(t, os.Mkdir(roDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(roDir, "in.txt"), []byte("host file\n"), 0o644))
	mnt := "/sessions/" + own + "/mnt"
	probeArgs := map[string]any{"own": own, "other": other, "victimPid": victimPID, "otherFile": "secret",
		"rw": mnt + "/work", "ro": mnt + "/readonly"}
	if _, err := os.Stat(curlPath); err == nil {
		probeArgs["url"] = "http://allowed.test:" + port + "/from-probe"
	}
	args, err := json.Marshal(probeArgs)
	require.NoError(t, err)
	h.call("spawn", map[string]any{"id": "probe", "name": own, "command": python, "args": []string{"-c", string(probe), string(args)},
		"allowedDomains": []string{"allowed.test"},
		"additionalMounts": map[string]any{
			"work":     map[string]string{"path": strings.TrimPrefix(work, "/"), "mode": "rw"},
			"readonly": map[string]string{"path": strings.TrimPrefix(roDir, "/"), "mode": "ro"},
		}}, nil)
	exit := ev.exit("probe")
	stderr := ev.output(protocol.EventStderr, "probe")
	require.NotNil(t, exit.ExitCode, "probe %+v: %s", exit, stderr)
	require.Equal(t, 0, *exit.ExitCode, stderr)
	var r map[string]any
	for _, line := range strings.Split(ev.output(protocol.EventStdout, "probe"), "\n") {
		if j, ok := strings.CutPrefix(line, "PROBE "); ok {
			require.NoError(t, json.Unmarshal([]byte(j), &r))
		}
	}
	require.NotNil(t, r, "no PROBE line; stderr: %s", stderr)
	t.Logf("probe on the %s backend: %v", backend, r)

	// (1) The agent: no ptrace, no /proc/1/mem, environ, fd, root.
	assert.Equal(t, "EPERM", r["agentPtrace"])
	for _, k := range []string{"agentMem", "agentEnviron", "agentFd", "agentRoot"} {
		assert.NotEqual(t, "ok", r[k], "%s must be refused", k)
	}
	// (3) No egress token in the spawn's environment: the proxy holds it.
	for _, k := range r["envKeys"].([]any) {
		assert.NotContains(t, strings.ToUpper(k.(string)), "TOKEN", "no token in the spawn's environment")
	}
	// (4) No 9p or virtiofs mount, directly or from a user namespace of its
	// own; user namespaces themselves still work (bubblewrap).
	for _, code := range r["mount9p"].([]any) {
		assert.NotEqual(t, "ok", code, "mounting 9p must be refused")
	}
	for _, code := range r["mountVirtioFS"].([]any) {
		assert.NotEqual(t, "ok", code, "mounting virtiofs must be refused")
	}
	assert.Equal(t, "ok", r["nestedUserns"])
	assert.Equal(t, "ok", r["nestedTmpfs"])
	assert.NotEqual(t, "ok", r["nestedMount9p"])
	assert.NotEqual(t, "ok", r["nestedMountVirtioFS"])
	// Its own session, rw and ro mounts, and egress still work.
	for _, k := range []string{"ownWrite", "ownRead", "ownChmod", "stdout", "rwWrite"} {
		assert.Equal(t, "ok", r[k], k)
	}
	assert.Equal(t, "EROFS", r["roWrite"])
	got, err := os.ReadFile(filepath.Join(work, "from-probe.txt"))
	require.NoError(t, err)
	assert.Equal(t, "probe\n", string(got))
	assert.NoFileExists(t, filepath.Join(roDir, "from-probe.txt"))
	assert.FileExists(t, filepath.Join(sessions, own, "probe.txt"))
	if probeArgs["url"] != nil {
		assert.Contains(t, r["curl"], "isolated egress answer for /from-probe")
	}

	if kvm {
		// (2) The other session is absent, its process hidden and another uid.
		assert.Equal(t, []any{own}, r["sessions"])
		assert.Equal(t, "ENOENT", r["otherSession"])
		assert.Equal(t, "ENOENT", r["otherFile"])
		for _, k := range []string{"victimPtrace", "victimEnviron", "victimRoot", "victimSignal"} {
			assert.NotEqual(t, "ok", r[k], "%s must be refused", k)
		}
		assert.Equal(t, "EPERM", r["victimSignal"])
		assert.Equal(t, []any{"EPERM"}, r["mount9p"])
		assert.Equal(t, "EPERM", r["nestedMount9p"])
		assert.Equal(t, []any{"EPERM"}, r["mountVirtioFS"])
		assert.Equal(t, "EPERM", r["nestedMountVirtioFS"])
		uid := int(r["uid"].(float64))
		assert.NotZero(t, uid)
		assert.NotZero(t, victimUID)
		assert.NotEqual(t, victimUID, uid, "each session its own uid")
		assert.Equal(t, "cowork", r["user"])
	} else {
		t.Logf("the process backend does not separate sessions: /sessions %v, other session %v, victim ptrace %v environ %v signal %v",
			r["sessions"], r["otherSession"], r["victimPtrace"], r["victimEnviron"], r["victimSignal"])
	}

	var running struct {
		Running bool `json:"running"`
	}
	h.call("isProcessRunning", map[string]any{"id": "victim"}, &running)
	assert.True(t, running.Running, "the other session's process is untouched")
	// A mount added to a running session reaches its process.
	lateDir := filepath.Join(host, "late")
	require.NoError(t, os.Mkdir(lateDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(lateDir, "f"), []byte("late mount\n"), 0o644))
	h.call("mountPath", map[string]any{"processId": "victim", "subpath": strings.TrimPrefix(lateDir, "/"), "mountName": "late", "mode": "ro"}, nil)
	ev.wait("the late mount in the running process", func(protocol.Event) bool {
		return strings.Contains(ev.outputLocked(protocol.EventStdout, "victim"), "late mount")
	})
	plantedSymlinkMounts(t, h, ev, own, other, filepath.Join(sessions, other), lateDir)
	gitInSession(t, h, ev, own, work, kvm)
	h.call("kill", map[string]any{"id": "victim", "signal": "SIGKILL"}, nil)
	ev.exit("victim")
	h.call("stopVM", nil, nil)
}

// plantedSymlinkMounts: a process of session own plants symlinks in its
// home where mountPath will mount for it — its last component to the other
// session's home, an intermediate one to the other's mnt — and the agent
// refuses both mounts, naming the symlink; a process of the other session
// finds nothing mounted or made in its home, and on the host nothing was
// made in its directory (otherHost). src is a host directory to mount.
func plantedSymlinkMounts(t *testing.T, h *harness, ev *events, own, other, otherHost, src string) {
	t.Helper()
	home, otherHome := "/sessions/"+own, "/sessions/"+other
	h.call("spawn", map[string]any{"id": "planter", "name": own, "command": "/bin/sh", "args": []string{"-c",
		"ln -s " + otherHome + " " + home + "/mnt/planted && ln -s " + otherHome + "/mnt " + home + "/mnt/deep && echo ready && exec sleep 1000"}}, nil)
	ev.wait("the symlinks planted", func(protocol.Event) bool {
		return strings.Contains(ev.outputLocked(protocol.EventStdout, "planter"), "ready")
	})
	for name, link := range map[string]string{"planted": home + "/mnt/planted", "deep/x": home + "/mnt/deep"} {
		resp := h.try("mountPath", map[string]any{"processId": "planter", "subpath": strings.TrimPrefix(src, "/"), "mountName": name, "mode": "ro"})
		assert.False(t, resp.Success, "mountPath through the symlink %s", link)
		assert.Contains(t, resp.Error, link+" is a symbolic link", name)
	}
	h.call("spawn", map[string]any{"id": "other-check", "name": other, "command": "/bin/sh", "args": []string{"-c",
		"test ! -e " + otherHome + "/f && test ! -e " + otherHome + "/mnt/x && echo clean"}}, nil)
	exit := ev.exit("other-check")
	require.NotNil(t, exit.ExitCode, ev.output(protocol.EventStderr, "other-check"))
	assert.Equal(t, "clean\n", ev.output(protocol.EventStdout, "other-check"), ev.output(protocol.EventStderr, "other-check"))
	assert.NoFileExists(t, filepath.Join(otherHost, "f"))
	assert.NoDirExists(t, filepath.Join(otherHost, "mnt", "x"))
	h.call("kill", map[string]any{"id": "planter", "signal": "SIGKILL"}, nil)
	ev.exit("planter")
}

// gitInSessionScript makes a repository, commits and asks for the status,
// in the session's home and in its rw mount, with no safe.directory: git
// checks the work tree with access(2) and refuses a repository another uid
// owns. It prints the owner it sees of each directory and its own uid.
const gitInSessionScript = `set -e
export GIT_AUTHOR_NAME=e2e GIT_AUTHOR_EMAIL=e2e@example.invalid GIT_COMMITTER_NAME=e2e GIT_COMMITTER_EMAIL=e2e@example.invalid
for dir in "$HOME_DIR/repo" "$WORK_DIR/repo"; do
  mkdir -p "$dir"
  cd "$dir"
  test -w . || { echo "access(2) says $dir is not writable" >&2; exit 1; }
  git init -q .
  echo tracked > tracked.txt
  git add tracked.txt
  git commit -q -m one
  echo untracked > new.txt
  status=$(git status --porcelain)
  echo "status $(echo "$status" | tr '\n' ' ')"
  echo "owner $(stat -c %u .) uid $(id -u)"
done
echo git-ok`

// gitInSession: git works in a session's own directory and in its rw
// mount, as the session's user — the files it made are its own in the
// guest (kvm) — and the commits are on the host.
func gitInSession(t *testing.T, h *harness, ev *events, session, work string, kvm bool) {
	t.Helper()
	if _, err := os.Stat("/usr/bin/git"); err != nil {
		t.Logf("git in the session not checked: no /usr/bin/git to share with the guest (%v)", err)
		return
	}
	home := "/sessions/" + session
	h.call("spawn", map[string]any{"id": "git", "name": session, "command": "/bin/sh", "args": []string{"-c", gitInSessionScript},
		"env":              map[string]string{"HOME_DIR": home, "WORK_DIR": home + "/mnt/work"},
		"additionalMounts": map[string]any{"work": map[string]string{"path": strings.TrimPrefix(work, "/"), "mode": "rw"}}}, nil)
	ev.exitOK("git", callTimeout)
	out := ev.output(protocol.EventStdout, "git")
	assert.Equal(t, 2, strings.Count(out, "status ?? new.txt \n"), "git status in both directories: %s", out)
	assert.FileExists(t, filepath.Join(work, "repo", ".git", "HEAD"), "the repository is on the host")
	if kvm {
		for _, line := range strings.Split(out, "\n") {
			if rest, ok := strings.CutPrefix(line, "owner "); ok {
				owner, uid, _ := strings.Cut(rest, " uid ")
				assert.Equal(t, uid, owner, "the session's files are its user's in the guest")
			}
		}
	}
}
