package e2e

import (
	"bufio"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Issue #18: the fields of the contract the helper used to accept and
// drop, driven through the built binary as the desktop client does: two
// profiles on one helper, the disk quota and lowWaterBytes, a helper killed
// and started again on the same socket and data directory, and the client
// itself going away. They run on COWORK_VMM_E2E_BACKEND (the process
// backend by default).

const contractRoot = "/home/e2e/.config/Claude"

// helperDirs are the directories one helper after another serves, as the
// client's respawn of a dead helper does: the same socket, the same data.
type helperDirs struct {
	bin, backend        string
	runtimeDir, dataDir string
	socket              string
}

func newHelperDirs(t *testing.T, backend string) helperDirs {
	t.Helper()
	d := helperDirs{bin: helperBinary(t, backend), backend: backend, runtimeDir: t.TempDir(), dataDir: t.TempDir()}
	require.NoError(t, os.Chmod(d.runtimeDir, 0o700))
	d.socket = filepath.Join(d.runtimeDir, "claude-cowork-vm.sock")
	return d
}

// env is the helper's environment, as startHelper gives it.
func (d helperDirs) env() []string {
	return append(os.Environ(),
		"XDG_RUNTIME_DIR="+d.runtimeDir,
		"XDG_DATA_HOME="+d.dataDir,
		"COWORK_VMM_BACKEND="+d.backend,
		"COWORK_VMM_EGRESS_TEST_HOSTS="+e2eTestHosts,
	)
}

// dataRoot is where the helper keeps its data (XDG_DATA_HOME/cowork-vmm).
func (d helperDirs) dataRoot() string { return filepath.Join(d.dataDir, "cowork-vmm") }

// start starts a helper on d and waits until it serves its socket (the
// helper replaces a stale one left by a killed helper).
func (d helperDirs) start(t *testing.T) *harness {
	t.Helper()
	return d.startWith(t, nil)
}

// startWith is start with the binary run by the command prefix wrap (nil:
// none), which must exec it (same pid), and extraEnv entries (KEY=VALUE)
// overriding its environment.
func (d helperDirs) startWith(t *testing.T, wrap []string, extraEnv ...string) *harness {
	t.Helper()
	h := &harness{stderr: &syncBuffer{}, exited: make(chan error, 1), dataDir: d.dataDir}
	args := append(append(wrap[:len(wrap):len(wrap)], d.bin), "-socket", d.socket)
	h.cmd = exec.Command(args[0], args[1:]...)
	h.cmd.Env = append(d.env(), extraEnv...)
	h.cmd.Stderr = h.stderr
	h.cmd.Stdout = h.stderr
	require.NoError(t, h.cmd.Start())
	go func() { h.exited <- h.cmd.Wait() }()
	t.Cleanup(func() {
		if h.cmd.ProcessState == nil {
			_ = h.cmd.Process.Kill()
			select {
			case <-h.exited:
			case <-time.After(callTimeout):
				t.Errorf("the helper had not exited %v after SIGKILL", callTimeout)
			}
		}
		if strings.Contains(h.stderr.String(), "WARNING: DATA RACE") {
			t.Error("the race detector found a data race in the helper or its agent")
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("helper (pid %d) stderr:\n%s", h.cmd.Process.Pid, h.stderr.String())
		}
	})
	waitSocket(t, d.socket, h.exited)
	h.client = &client{t: t, socket: d.socket}
	return h
}

// waitSocket waits until a helper accepts connections at path (a stale
// socket left by a killed helper refuses them).
func waitSocket(t *testing.T, path string, exited <-chan error) {
	t.Helper()
	deadline := time.Now().Add(callTimeout)
	for {
		if conn, err := net.Dial("unix", path); err == nil {
			conn.Close()
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("helper exited before serving its socket: %v", err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "the helper did not serve %s", path)
		time.Sleep(10 * time.Millisecond)
	}
}

// profilePipe opens a pipe configured for a profile, as the client's first
// call on a new pipe does.
func profilePipe(t *testing.T, socket, name string) *client {
	t.Helper()
	pipe, err := protocol.DialPipe(t.Context(), socket)
	require.NoError(t, err)
	t.Cleanup(func() { pipe.Close() })
	c := &client{t: t, socket: socket, pipe: pipe}
	c.call("configure", map[string]any{"userDataName": name, "userDataRoot": contractRoot, "sessionOnly": true}, nil)
	return c
}

// bootProfile configures a profile's sizing, starts its guest and waits
// until it is connected.
func bootProfile(t *testing.T, c *client, name string) {
	t.Helper()
	c.call("configure", map[string]any{"userDataName": name, "userDataRoot": contractRoot, "networkDrives": []any{}, "memoryMB": 1024, "cpuCount": 1}, nil)
	c.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "memoryGB": 1.0, "cpuCount": 1}, nil)
	waitConnected(t, c)
}

func subscribeProfile(t *testing.T, socket, name string) *events {
	t.Helper()
	return subscribe(t, socket, map[string]any{"userDataName": name, "userDataRoot": contractRoot})
}

func sh(script string) []string { return []string{"-c", script} }

// waitOutput waits until a process has printed want on stdout.
func (e *events) waitOutput(id, want string) {
	e.t.Helper()
	e.wait(id+" printing "+want, func(protocol.Event) bool {
		return strings.Contains(e.outputLocked(protocol.EventStdout, id), want)
	})
}

// TestContractTwoProfiles: two profiles on one helper, the same session
// name and process id in each. A's stopVM and deleteSessionDirs leave B's
// process and directories alone; neither sees the other's events.
func TestContractTwoProfiles(t *testing.T) { contractTwoProfiles(t, e2eBackend(t)) }

// TestKVMContractTwoProfiles is TestContractTwoProfiles on the kvm backend
// (TestNestedKVMContract runs it in the harness where this KVM cannot
// boot Linux).
func TestKVMContractTwoProfiles(t *testing.T) {
	contractTwoProfiles(t, kvmBackend(t, "TestNestedKVMContract"))
	recordBoot(t)
}

func contractTwoProfiles(t *testing.T, backend string) {
	h := startHelper(t, backend)
	a, b := profilePipe(t, h.socket, "contract-A"), profilePipe(t, h.socket, "contract-B")
	evA, evB := subscribeProfile(t, h.socket, "contract-A"), subscribeProfile(t, h.socket, "contract-B")
	bootProfile(t, a, "contract-A")
	bootProfile(t, b, "contract-B")

	a.call("spawn", map[string]any{"id": "same", "name": "shared", "command": "/bin/sh", "args": sh("echo A-out; exec sleep 1000")}, nil)
	b.call("spawn", map[string]any{"id": "same", "name": "shared", "command": "/bin/sh",
		"args": sh("echo B-file > /sessions/shared/b-file; echo B-out; exec sleep 1000")}, nil)
	b.call("spawn", map[string]any{"id": "b-idle", "name": "b-idle", "command": "/bin/sh", "args": sh("echo keep > /sessions/b-idle/keep")}, nil)
	evA.waitOutput("same", "A-out")
	evB.waitOutput("same", "B-out")
	evB.exit("b-idle")

	// A's stopVM ends A's process only.
	a.call("stopVM", nil, nil)
	assert.NotEmpty(t, evA.exit("same").Signal)
	var running struct {
		Running bool `json:"running"`
	}
	b.call("isProcessRunning", map[string]any{"id": "same"}, &running)
	assert.True(t, running.Running, "B's process of the same id still runs")
	b.call("isRunning", nil, &running)
	assert.True(t, running.Running, "B's guest still runs")

	// A's deleteSessionDirs deletes A's directories, not B's.
	aSessions := filepath.Join(h.dataDir, "cowork-vmm", "sessions") // A came first
	bHome, err := filepath.Glob(filepath.Join(h.dataDir, "cowork-vmm", "profiles", "contract-B-*", "sessions", "shared"))
	require.NoError(t, err)
	require.Len(t, bHome, 1, "B's sessions live in a directory of B's")
	require.DirExists(t, filepath.Join(aSessions, "shared"))
	var deleted struct {
		Deleted []string          `json:"deleted"`
		Errors  map[string]string `json:"errors"`
	}
	a.call("deleteSessionDirs", map[string]any{"names": []string{"shared", "b-idle"}}, &deleted)
	assert.Contains(t, deleted.Deleted, "shared")
	assert.NoDirExists(t, filepath.Join(aSessions, "shared"))
	assert.FileExists(t, filepath.Join(bHome[0], "b-file"))
	assert.FileExists(t, filepath.Join(filepath.Dir(bHome[0]), "b-idle", "keep"))
	b.call("deleteSessionDirs", map[string]any{"names": []string{"shared"}}, &deleted)
	assert.Contains(t, deleted.Errors, "shared", "B's own session is busy")

	evA.mu.Lock()
	for _, ev := range evA.all {
		assert.NotContains(t, ev.Data, "B-", "a B event reached A: %+v", ev)
		assert.NotEqual(t, "b-idle", ev.ID, "a B event reached A: %+v", ev)
	}
	evA.mu.Unlock()
	evB.mu.Lock()
	for _, ev := range evB.all {
		assert.NotContains(t, ev.Data, "A-", "an A event reached B: %+v", ev)
		assert.False(t, ev.Type == protocol.EventExit && ev.ID == "same", "A's exit reached B: %+v", ev)
	}
	evB.mu.Unlock()
	b.call("stopVM", nil, nil)
}

// diskInfo is getSessionsDiskInfo's result.
type diskInfo struct {
	TotalBytes int64 `json:"totalBytes"`
	FreeBytes  int64 `json:"freeBytes"`
	Sessions   []struct {
		Name      string `json:"name"`
		SizeBytes int64  `json:"sizeBytes"`
	} `json:"sessions"`
}

func (d diskInfo) size(name string) int64 {
	for _, s := range d.Sessions {
		if s.Name == name {
			return s.SizeBytes
		}
	}
	return -1
}

// TestContractDiskQuota: createVM's diskSizeGB is the profile's quota,
// which getSessionsDiskInfo reports against; below lowWaterBytes a session
// that is still being written is measured afresh before the answer.
func TestContractDiskQuota(t *testing.T) { contractDiskQuota(t, e2eBackend(t)) }

// TestKVMContractDiskQuota is TestContractDiskQuota on the kvm backend
// (TestNestedKVMContract runs it in the harness where this KVM cannot
// boot Linux).
func TestKVMContractDiskQuota(t *testing.T) {
	contractDiskQuota(t, kvmBackend(t, "TestNestedKVMContract"))
	recordBoot(t)
}

func contractDiskQuota(t *testing.T, backend string) {
	h := startHelper(t, backend)
	c := profilePipe(t, h.socket, "contract-quota")
	ev := subscribeProfile(t, h.socket, "contract-quota")
	c.call("createVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "diskSizeGB": 1}, nil)
	bootProfile(t, c, "contract-quota")

	c.call("spawn", map[string]any{"id": "writer", "name": "q", "command": "/bin/sh", "args": sh("head -c 3000000 /dev/zero > /sessions/q/blob")}, nil)
	require.NotNil(t, ev.exit("writer").ExitCode)
	var d diskInfo
	c.call("getSessionsDiskInfo", map[string]any{"lowWaterBytes": 0}, &d)
	assert.Equal(t, int64(1<<30), d.TotalBytes, "the quota, not the filesystem")
	assert.GreaterOrEqual(t, d.size("q"), int64(3_000_000))
	assert.LessOrEqual(t, d.FreeBytes, int64(1<<30)-d.size("q"))

	c.call("spawn", map[string]any{"id": "grower", "name": "q", "command": "/bin/sh",
		"args": sh("head -c 2000000 /dev/zero > /sessions/q/grown; echo written; exec sleep 1000")}, nil)
	ev.waitOutput("grower", "written")
	c.call("getSessionsDiskInfo", map[string]any{"lowWaterBytes": 2 << 30}, &d) // more than the quota: below it
	assert.GreaterOrEqual(t, d.size("q"), int64(5_000_000), "the busy session was measured afresh")
	assert.LessOrEqual(t, d.FreeBytes, int64(1<<30)-5_000_000)
	c.call("stopVM", nil, nil)
}

// TestContractRestart kills the helper mid-session (SIGKILL) and starts
// another on the same socket and data directory, as the client does; the
// client's retried calls succeed, nothing stale is reported, and what the
// client set before (SDK, token, quota) is still in force.
func TestContractRestart(t *testing.T) { contractRestart(t, e2eBackend(t)) }

// TestKVMContractRestart is TestContractRestart on the kvm backend
// (TestNestedKVMContract runs it in the harness where this KVM cannot
// boot Linux).
func TestKVMContractRestart(t *testing.T) {
	contractRestart(t, kvmBackend(t, "TestNestedKVMContract"))
	recordBoot(t)
}

func contractRestart(t *testing.T, backend string) {
	dirs := newHelperDirs(t, backend)
	first := dirs.start(t)
	c := profilePipe(t, dirs.socket, "contract-restart")
	ev := subscribeProfile(t, dirs.socket, "contract-restart")
	c.call("createVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "diskSizeGB": 2}, nil)
	bootProfile(t, c, "contract-restart")
	sdkRoot := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(sdkRoot, "3.0.0"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sdkRoot, "3.0.0", "claude"), []byte("#!/bin/sh\necho \"sdk token:$CLAUDE_CODE_OAUTH_TOKEN\"\n"), 0o755))
	c.call("installSdk", map[string]any{"sdkSubpath": strings.TrimPrefix(sdkRoot, "/"), "version": "3.0.0"}, nil)
	c.call("addApprovedOauthToken", map[string]any{"token": "kept-token"}, nil)
	c.call("spawn", map[string]any{"id": "long", "name": "r", "command": "/bin/sh", "args": sh("echo kept > /sessions/r/note.txt; echo up; exec sleep 1000")}, nil)
	ev.waitOutput("long", "up")
	sandbox := 0
	if backend == "process" {
		sandbox = sandboxPID(t, first.stderr.String())
	}

	require.NoError(t, first.cmd.Process.Kill())
	<-first.exited
	if sandbox != 0 {
		waitGone(t, sandbox, "the dead helper's sandbox")
	}

	dirs.start(t)
	c = profilePipe(t, dirs.socket, "contract-restart")
	for method, want := range map[string]string{
		"isRunning":        `{"running":false}`,
		"isGuestConnected": `{"connected":false}`,
	} {
		r := c.try(method, nil)
		require.True(t, r.Success, r.Error)
		assert.JSONEq(t, want, string(r.Result), "%s after the restart", method)
	}
	r := c.try("isProcessRunning", map[string]any{"id": "long"})
	assert.JSONEq(t, `{"running":false}`, string(r.Result), "the old process is not reported running")
	var file struct{ Content string }
	c.call("readFile", map[string]any{"processName": "r", "filePath": "/sessions/r/note.txt"}, &file)
	content, err := base64.StdEncoding.DecodeString(file.Content)
	require.NoError(t, err)
	assert.Equal(t, "kept\n", string(content), "readFile while the guest is down reads the session's host directory")

	ev = subscribeProfile(t, dirs.socket, "contract-restart")
	bootProfile(t, c, "contract-restart")
	c.call("spawn", map[string]any{"id": "again", "name": "r", "command": "/usr/local/bin/claude"}, nil) // no installSdk, no token
	ev.exit("again")
	assert.Equal(t, "sdk token:kept-token\n", ev.output(protocol.EventStdout, "again"))
	var d diskInfo
	c.call("getSessionsDiskInfo", map[string]any{"lowWaterBytes": 0}, &d)
	assert.Equal(t, int64(2<<30), d.TotalBytes, "the quota survived")
	assert.Positive(t, d.size("r"))
	c.call("stopVM", nil, nil)
}

// waitGone waits until process pid has ended (or is a zombie waiting for
// a reaper).
func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(callTimeout)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if errors.Is(err, os.ErrNotExist) {
			return
		}
		if i := strings.LastIndexByte(string(stat), ')'); err == nil && i > 0 && strings.HasPrefix(string(stat[i+1:]), " Z") {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s (pid %d) is still running", what, pid)
		time.Sleep(20 * time.Millisecond)
	}
}

// TestContractClientGone: the desktop client that started the helper
// exits (its pipes close, the helper is orphaned). The helper stops its
// guest cleanly — the process gets SIGTERM, its exit is sent — while its
// log has nowhere to go (SIGPIPE must not kill it), removes the socket and
// exits. The guest's processes do not inherit the helper's ignored SIGPIPE.
func TestContractClientGone(t *testing.T) { contractClientGone(t, e2eBackend(t)) }

// TestKVMContractClientGone is TestContractClientGone on the kvm backend
// (TestNestedKVMContract runs it in the harness where this KVM cannot
// boot Linux).
func TestKVMContractClientGone(t *testing.T) {
	contractClientGone(t, kvmBackend(t, "TestNestedKVMContract"))
	recordBoot(t)
}

func contractClientGone(t *testing.T, backend string) {
	dirs := newHelperDirs(t, backend)
	stdinR, stdinW, err := os.Pipe()
	require.NoError(t, err)
	stderrR, stderrW, err := os.Pipe()
	require.NoError(t, err)
	// The "client": a shell that starts the helper with its pipes, as the
	// desktop client does, and tells its pid (fd 3: a background job's
	// stdin would be /dev/null).
	client := exec.Command("/bin/sh", "-c", `exec 3<&0; "$0" -socket "$1" <&3 3<&- & echo $!; wait`, dirs.bin, dirs.socket)
	client.Env = dirs.env()
	client.Stdin = stdinR
	client.Stderr = stderrW
	stdout, err := client.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, client.Start())
	stdinR.Close()
	stderrW.Close()
	t.Cleanup(func() { _ = client.Process.Kill(); _ = client.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	log := &syncBuffer{}
	logDone := make(chan struct{})
	go func() { _, _ = io.Copy(log, stderrR); close(logDone) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("helper log until the client went:\n%s", log.String())
		}
	})
	waitSocket(t, dirs.socket, nil)

	c := profilePipe(t, dirs.socket, "contract-gone")
	ev := subscribeProfile(t, dirs.socket, "contract-gone")
	bootProfile(t, c, "contract-gone")
	c.call("spawn", map[string]any{"id": "sigign", "name": "g", "command": "/bin/sh", "args": sh("grep SigIgn /proc/self/status")}, nil)
	ev.exit("sigign")
	assertSIGPIPENotIgnored(t, ev.output(protocol.EventStdout, "sigign"))
	c.call("spawn", map[string]any{"id": "term", "name": "g", "command": "/bin/sh",
		"args": sh("trap 'echo got-term > /sessions/g/termed; exit 0' TERM; echo ready; while :; do sleep 0.1; done")}, nil)
	ev.waitOutput("term", "ready")

	// The client dies: its end of the helper's stdin and stderr close.
	require.NoError(t, stdinW.Close())
	require.NoError(t, stderrR.Close())
	<-logDone
	require.NoError(t, client.Process.Kill())
	_ = client.Wait()

	exit := ev.exit("term")
	require.NotNil(t, exit.ExitCode, "the process ended by its SIGTERM trap: %+v", exit)
	assert.Equal(t, 0, *exit.ExitCode)
	waitGone(t, pid, "the orphaned helper")
	_, err = os.Lstat(dirs.socket)
	assert.True(t, errors.Is(err, os.ErrNotExist), "the socket was removed: the shutdown ran to its end (%v)", err)
	termed, err := os.ReadFile(filepath.Join(dirs.dataRoot(), "sessions", "g", "termed"))
	require.NoError(t, err, "the guest was stopped cleanly")
	assert.Equal(t, "got-term\n", string(termed))
}

// assertSIGPIPENotIgnored checks a "SigIgn:\t<hex mask>" line.
func assertSIGPIPENotIgnored(t *testing.T, out string) {
	t.Helper()
	_, mask, ok := strings.Cut(strings.TrimSpace(out), "SigIgn:")
	require.True(t, ok, "no SigIgn line in %q", out)
	bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
	require.NoError(t, err)
	assert.Zero(t, bits&(1<<(uint(syscall.SIGPIPE)-1)), "a guest process inherited an ignored SIGPIPE (SigIgn %s)", mask)
}
