package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// syncBuffer collects the helper's stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// helperBinary returns COWORK_VMM_E2E_BIN or builds the binary: with the
// race detector under -race, except for the kvm backend, whose guest /init
// (the binary itself) must be static.
func helperBinary(t *testing.T, backend string) string {
	t.Helper()
	if bin := os.Getenv("COWORK_VMM_E2E_BIN"); bin != "" {
		return bin
	}
	if backend == "kvm" {
		return nested.BuildCoworkVMM(t)
	}
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(here))
	bin := filepath.Join(t.TempDir(), "cowork-vmm")
	args := []string{"build", "-o", bin}
	env := append(os.Environ(), "CGO_ENABLED=0")
	if raceEnabled {
		// Under -race the helper is built with the race detector as well, so
		// races in the real binary fail the test (the detector needs cgo).
		args = append(args, "-race")
		env = append(os.Environ(), "CGO_ENABLED=1")
	}
	cmd := exec.Command("go", append(args, "./cmd/cowork-vmm")...)
	cmd.Dir = root
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// skipWithoutUserNamespaces skips when the process backend cannot work here.
func skipWithoutUserNamespaces(t *testing.T) {
	t.Helper()
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	if err := cmd.Run(); err != nil {
		t.Skipf("user namespaces are unavailable (%v): the process backend cannot run here", err)
	}
}

type harness struct {
	*client
	cmd     *exec.Cmd
	stderr  *syncBuffer
	exited  chan error
	dataDir string
}

// e2eTestHosts is what every test's helper gets as
// COWORK_VMM_EGRESS_TEST_HOSTS: all name resolution of the helper is then
// confined to these names on loopback, so no test sends a DNS query or a
// connection anywhere else (the networkStatus check included).
const e2eTestHosts = "allowed.test=127.0.0.1,blocked.test=127.0.0.1,sub.wild.test=127.0.0.1,evil-wild.test=127.0.0.1,wild.test=127.0.0.1"

// startHelper starts the binary as the desktop client does, on fresh
// directories; extraEnv entries (KEY=VALUE) override its environment.
func startHelper(t *testing.T, backend string, extraEnv ...string) *harness {
	t.Helper()
	return newHelperDirs(t, backend).startWith(t, nil, extraEnv...)
}

// e2eBackend is the backend under test: $COWORK_VMM_E2E_BACKEND, else the
// process backend, whose tests skip where user namespaces are unavailable.
func e2eBackend(t *testing.T) string {
	t.Helper()
	backend := os.Getenv("COWORK_VMM_E2E_BACKEND")
	if backend == "" {
		backend = "process"
	}
	if backend == "process" {
		skipWithoutUserNamespaces(t)
	}
	return backend
}

// kvmBackend skips t unless the kvm backend can boot a guest here: this
// host's KVM boots Linux (wrapper runs t in the nested harness otherwise)
// and a guest kernel is found ($COWORK_VMM_KERNEL or the build cache).
func kvmBackend(t *testing.T, wrapper string) string {
	t.Helper()
	nested.RequireLinuxBoot(t, wrapper)
	if os.Getenv("COWORK_VMM_KERNEL") == "" {
		if _, err := kernel.Find(kernel.Guest); err != nil {
			t.Skipf("no guest kernel: %v", err)
		}
	}
	return "kvm"
}

// recordBoot notes a kvm-backend test that passed: it booted Linux.
func recordBoot(t *testing.T) {
	t.Helper()
	if !t.Failed() {
		nested.RecordLinuxBoot(t)
	}
}

func TestClientFlow(t *testing.T) { clientFlow(t, e2eBackend(t)) }

// TestKVMClientFlow is TestClientFlow on the kvm backend, where this host's
// KVM boots Linux (TestNestedKVMClientFlow runs it in the harness elsewhere).
func TestKVMClientFlow(t *testing.T) {
	clientFlow(t, kvmBackend(t, "TestNestedKVMClientFlow"))
	recordBoot(t)
}

// clientFlow drives the built binary through the desktop client's whole
// flow on backend.
func clientFlow(t *testing.T, backend string) {
	h := startHelper(t, backend)
	const profile, profileRoot = "e2e-profile", "/home/e2e/.config/Claude"

	// One-shot isRunning.
	resp := h.oneShot("isRunning", nil)
	require.True(t, resp.Success, resp.Error)
	assert.JSONEq(t, `{"running":false}`, string(resp.Result))

	// The pipe, configured as the client does first.
	pipe, err := protocol.DialPipe(t.Context(), h.socket)
	require.NoError(t, err)
	defer pipe.Close()
	h.pipe = pipe
	h.call("configure", map[string]any{"userDataName": profile, "userDataRoot": profileRoot, "sessionOnly": true}, nil)

	// Several calls at once, each reply matched by id.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			method := []string{"isRunning", "isGuestConnected", "getNetworkDrives", "isProcessRunning"}[i%4]
			r := h.try(method, map[string]any{"id": "none"})
			assert.True(t, r.Success, "%s: %s", method, r.Error)
		}()
	}
	wg.Wait()

	// The subscription: ack first (SubscribeEvents checks it), then events.
	ev := subscribe(t, h.socket, map[string]any{"userDataName": profile, "userDataRoot": profileRoot})

	// Unknown method wording.
	r := h.try("frobnicate", nil)
	assert.False(t, r.Success)
	assert.Contains(t, r.Error, "Unknown method: frobnicate")

	// Boot.
	h.call("stopVM", nil, nil) // the client cleans up first; nothing runs
	h.call("configure", map[string]any{"userDataName": profile, "userDataRoot": profileRoot, "networkDrives": []any{}, "memoryMB": 2048, "cpuCount": 2}, nil)
	h.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "memoryGB": 2.0, "cpuCount": 2}, nil)
	ev.wait("apiReachability", func(e protocol.Event) bool { return e.Type == protocol.EventAPIReachability && e.Status != "" })
	ev.wait("a startupStep", func(e protocol.Event) bool { return e.Type == protocol.EventStartupStep && e.Step != "" })
	waitConnected(t, h.client)

	// installSdk with a fake SDK that reports what it sees.
	sdkRoot := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(sdkRoot, "2.1.0"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sdkRoot, "2.1.0", "claude"), []byte(`#!/bin/sh
echo "args:$*"
echo "token:$CLAUDE_CODE_OAUTH_TOKEN"
echo "pwd:$(pwd)"
echo "foo:$FOO"
echo "to-stderr" >&2
exit 7
`), 0o755))
	h.call("installSdk", map[string]any{"sdkSubpath": strings.TrimPrefix(sdkRoot, "/"), "version": "2.1.0"}, nil)

	host := t.TempDir()
	work := filepath.Join(host, "work") // missing: an rw source is created
	roDir := filepath.Join(host, "readonly")
	require.NoError(t, os.Mkdir(roDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(roDir, "in.txt"), []byte("host file\n"), 0o644))
	const session = "e2e-session"
	mounts := map[string]any{
		"work":     map[string]string{"path": strings.TrimPrefix(work, "/"), "mode": "rw"},
		"readonly": map[string]string{"path": strings.TrimPrefix(roDir, "/"), "mode": "ro"},
		"missing":  map[string]string{"path": strings.TrimPrefix(filepath.Join(host, "nope"), "/"), "mode": "ro"},
	}
	var spawned struct {
		FailedMounts []string `json:"failedMounts"`
	}
	h.call("spawn", map[string]any{
		"id": "sdk", "name": session, "command": "/usr/local/bin/claude", "args": []string{"--print", "hello world"},
		"isResume": false, "env": map[string]string{"FOO": "bar"}, "oauthToken": "tok-e2e", "additionalMounts": mounts,
	}, &spawned)
	assert.Equal(t, []string{"missing"}, spawned.FailedMounts)
	exit := ev.exit("sdk")
	require.NotNil(t, exit.ExitCode, "exit %+v", exit)
	assert.Equal(t, 7, *exit.ExitCode)
	out := ev.output(protocol.EventStdout, "sdk")
	assert.Contains(t, out, "args:--print hello world\n")
	assert.Contains(t, out, "token:tok-e2e\n")
	assert.Contains(t, out, "pwd:/sessions/"+session+"\n")
	assert.Contains(t, out, "foo:bar\n")
	assert.Equal(t, "to-stderr\n", ev.output(protocol.EventStderr, "sdk"))
	assert.DirExists(t, work)

	// rw written from the guest, read on the host; ro refuses writes.
	mnt := "/sessions/" + session + "/mnt"
	h.call("spawn", map[string]any{
		"id": "mounts", "name": session, "command": "/bin/sh", "args": []string{"-c",
			"echo from-guest > " + mnt + "/work/out.txt; touch " + mnt + "/readonly/new 2>&1; cat " + mnt + "/readonly/in.txt"},
		"additionalMounts": mounts,
	}, nil)
	exit = ev.exit("mounts")
	out = ev.output(protocol.EventStdout, "mounts")
	assert.Contains(t, out, "Read-only file system")
	assert.Contains(t, out, "host file")
	got, err := os.ReadFile(filepath.Join(work, "out.txt"))
	require.NoError(t, err)
	assert.Equal(t, "from-guest\n", string(got))
	assert.NoFileExists(t, filepath.Join(roDir, "new"))

	// writeStdin, isProcessRunning, kill SIGTERM.
	h.call("spawn", map[string]any{"id": "reader", "name": session, "command": "/bin/sh",
		"args": []string{"-c", "read line; echo got:$line; exec sleep 1000"}}, nil)
	var running struct {
		Running  bool `json:"running"`
		ExitCode *int `json:"exitCode"`
	}
	h.call("isProcessRunning", map[string]any{"id": "reader"}, &running)
	assert.True(t, running.Running)
	h.call("writeStdin", map[string]any{"id": "reader", "data": "hello\n"}, nil)
	ev.wait("echo of stdin", func(e protocol.Event) bool {
		return strings.Contains(ev.outputLocked(protocol.EventStdout, "reader"), "got:hello\n")
	})
	h.call("kill", map[string]any{"id": "reader", "signal": "SIGTERM"}, nil)
	exit = ev.exit("reader")
	assert.Equal(t, "SIGTERM", exit.Signal)
	// kill takes a name in any case or a number, and every Linux signal
	// comes back as itself (SIGPWR was once reported as SIGKILL).
	for id, sig := range map[string][2]string{"sig-pwr": {"pwr", "SIGPWR"}, "sig-num": {"9", "SIGKILL"}, "sig-usr": {"sigusr1", "SIGUSR1"}} {
		h.call("spawn", map[string]any{"id": id, "name": session, "command": "/bin/sh", "args": []string{"-c", "echo up; exec sleep 1000"}}, nil)
		ev.wait(id+" up", func(protocol.Event) bool { return strings.Contains(ev.outputLocked(protocol.EventStdout, id), "up") })
		h.call("kill", map[string]any{"id": id, "signal": sig[0]}, nil)
		assert.Equal(t, sig[1], ev.exit(id).Signal, "kill %q", sig[0])
	}
	assert.False(t, h.try("kill", map[string]any{"id": "reader", "signal": "SIGNOPE"}).Success, "an unknown signal is refused")
	h.call("isProcessRunning", map[string]any{"id": "reader"}, &running)
	assert.False(t, running.Running)
	running.ExitCode = nil
	h.call("isProcessRunning", map[string]any{"id": "sdk"}, &running)
	assert.False(t, running.Running)
	require.NotNil(t, running.ExitCode)
	assert.Equal(t, 7, *running.ExitCode)
	resp = h.try("isProcessRunning", map[string]any{"id": "never-spawned"})
	assert.JSONEq(t, `{"running":false}`, string(resp.Result))

	// readFile: base64 of the raw bytes; paths outside the session refused.
	var file struct{ Content string }
	h.call("readFile", map[string]any{"processName": session, "filePath": mnt + "/work/out.txt"}, &file)
	decoded, err := base64.StdEncoding.DecodeString(file.Content)
	require.NoError(t, err)
	assert.Equal(t, "from-guest\n", string(decoded))
	resp = h.try("readFile", map[string]any{"processName": session, "filePath": "/etc/passwd"})
	assert.False(t, resp.Success)

	// Disk info lists the session.
	var disk struct {
		TotalBytes int64 `json:"totalBytes"`
		FreeBytes  int64 `json:"freeBytes"`
		Sessions   []struct {
			Name      string `json:"name"`
			SizeBytes int64  `json:"sizeBytes"`
		} `json:"sessions"`
	}
	h.call("getSessionsDiskInfo", map[string]any{"lowWaterBytes": 0}, &disk)
	assert.Positive(t, disk.TotalBytes)
	var names []string
	for _, s := range disk.Sessions {
		names = append(names, s.Name)
	}
	assert.Contains(t, names, session)

	// deleteSessionDirs: refuses ../.. and a busy session, deletes an idle one.
	keep := filepath.Join(host, "keep")
	h.call("spawn", map[string]any{"id": "idle", "name": "idle-session", "command": "/bin/sh",
		"args":             []string{"-c", "echo data > /sessions/idle-session/file"},
		"additionalMounts": map[string]any{"keep": map[string]string{"path": strings.TrimPrefix(keep, "/"), "mode": "rwd"}}}, nil)
	ev.exit("idle")
	require.NoError(t, os.WriteFile(filepath.Join(keep, "precious"), []byte("x"), 0o644))
	// A busy process that ignores SIGTERM, for delete and for stopVM below.
	h.call("spawn", map[string]any{"id": "busy", "name": session, "command": "/bin/sh",
		"args": []string{"-c", "trap '' TERM; echo ready; sleep 1000"}}, nil)
	ev.wait("busy ready", func(protocol.Event) bool {
		return strings.Contains(ev.outputLocked(protocol.EventStdout, "busy"), "ready")
	})
	// mountPath adds a mount to the running session; addApprovedOauthToken
	// supplies the token when a spawn gives none.
	extra := filepath.Join(host, "extra")
	require.NoError(t, os.Mkdir(extra, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(extra, "f"), []byte("extra file\n"), 0o644))
	h.call("mountPath", map[string]any{"processId": "busy", "subpath": strings.TrimPrefix(extra, "/"), "mountName": "extra/deep", "mode": "ro"}, nil)
	h.call("addApprovedOauthToken", map[string]any{"token": "approved-token"}, nil)
	h.call("spawn", map[string]any{"id": "extra", "name": session, "command": "/bin/sh",
		"args": []string{"-c", "cat " + mnt + "/extra/deep/f; echo token=$CLAUDE_CODE_OAUTH_TOKEN"}}, nil)
	ev.exit("extra")
	assert.Equal(t, "extra file\ntoken=approved-token\n", ev.output(protocol.EventStdout, "extra"))

	// A dropped subscription loses nothing: what happens while no one
	// listens is delivered, once, to the next subscription of the profile.
	require.NoError(t, ev.stream.Close())
	waitLog(t, h, "event subscriber disconnected")
	h.call("spawn", map[string]any{"id": "offline", "name": session, "command": "/bin/sh", "args": []string{"-c", "echo while-unsubscribed"}}, nil)
	waitExited(t, h.client, "offline")
	ev = subscribe(t, h.socket, map[string]any{"userDataName": profile, "userDataRoot": profileRoot})
	ev.exit("offline")
	assert.Equal(t, "while-unsubscribed\n", ev.output(protocol.EventStdout, "offline"))
	ev.mu.Lock()
	for _, e := range ev.all {
		assert.NotEqual(t, "extra", e.ID, "events already delivered are not repeated: %+v", e)
	}
	ev.mu.Unlock()

	sessionsDir := filepath.Join(h.dataDir, "cowork-vmm", "sessions")
	require.DirExists(t, filepath.Join(sessionsDir, "idle-session"))
	var deleted struct {
		Deleted []string          `json:"deleted"`
		Errors  map[string]string `json:"errors"`
	}
	h.call("deleteSessionDirs", map[string]any{"names": []string{"../..", session, "idle-session"}}, &deleted)
	assert.Equal(t, []string{"idle-session"}, deleted.Deleted)
	assert.Contains(t, deleted.Errors, "../..")
	assert.Contains(t, deleted.Errors, session)
	assert.NoDirExists(t, filepath.Join(sessionsDir, "idle-session"))
	assert.DirExists(t, filepath.Join(sessionsDir, session))
	assert.FileExists(t, filepath.Join(keep, "precious"), "mount sources are untouched")
	assert.DirExists(t, h.dataDir)

	// Prune's result shape.
	resp = h.try("pruneSessionCaches", map[string]any{"onlyIfFreeBytesBelow": 0, "includeSessionTmp": true, "sessionTmpOlderThanSeconds": 3600})
	require.True(t, resp.Success, resp.Error)
	var prune map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(resp.Result, &prune))
	for _, k := range []string{"prunedSessions", "skippedSessions", "freedBytes", "errors"} {
		assert.Contains(t, prune, k)
	}
	assert.JSONEq(t, `["`+session+`"]`, string(prune["skippedSessions"]), "the busy session is skipped")

	// Malformed frames are rejected while the helper keeps serving.
	raw := h.dialRaw()
	raw.sendBytes([]byte(`{"method":"isRunning","id":1,`))
	bad, err := raw.read()
	require.NoError(t, err)
	assert.False(t, bad.Success)
	raw.send(map[string]any{"method": "isRunning", "id": 2})
	good, err := raw.read()
	require.NoError(t, err)
	assert.True(t, good.Success, "the same connection keeps working after invalid JSON")
	big := h.dialRaw()
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], protocol.MaxFrameSize+1)
	_, err = big.conn.Write(hdr[:])
	require.NoError(t, err)
	if r, err := big.read(); err == nil {
		assert.False(t, r.Success, "an oversized frame is refused")
		_, err = big.read()
		assert.Error(t, err, "and its connection closed")
	}
	assert.True(t, h.oneShot("isRunning", nil).Success, "other connections are served")

	// stopVM is slow (the busy process ignores SIGTERM for the grace period):
	// fast calls on the same pipe overtake it.
	stopper := h.dialRaw()
	stopper.send(map[string]any{"method": "stopVM", "id": 10})
	stopper.send(map[string]any{"method": "isGuestConnected", "id": 11})
	stopper.send(map[string]any{"method": "getNetworkDrives", "id": 12})
	var order []uint64
	for range 3 {
		r, err := stopper.read()
		require.NoError(t, err)
		require.NotNil(t, r.ID)
		assert.True(t, r.Success, r.Error)
		order = append(order, *r.ID)
	}
	assert.Equal(t, uint64(10), order[2], "replies come as calls finish, matched by id: %v", order)
	exit = ev.exit("busy")
	assert.Equal(t, "SIGKILL", exit.Signal, "SIGTERM ignored, then SIGKILL after the grace period")
	resp = h.oneShot("isRunning", nil)
	assert.JSONEq(t, `{"running":false}`, string(resp.Result))
	resp = h.oneShot("isGuestConnected", nil)
	assert.JSONEq(t, `{"connected":false}`, string(resp.Result))

	// A later startVM boots a fresh guest; the session's files are still there.
	h.call("startVM", map[string]any{"bundlePath": ""}, nil)
	waitConnected(t, h.client)
	h.call("spawn", map[string]any{"id": "again", "name": session, "command": "/bin/sh",
		"args": []string{"-c", "cat " + mnt + "/work/out.txt; sleep 1000"}, "additionalMounts": mounts}, nil)
	ev.wait("output after restart", func(protocol.Event) bool {
		return strings.Contains(ev.outputLocked(protocol.EventStdout, "again"), "from-guest")
	})

	// SIGTERM with a process running: clean exit, socket removed.
	require.NoError(t, h.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-h.exited:
		assert.NoError(t, err, "exit status 0 on SIGTERM")
	case <-time.After(callTimeout):
		t.Fatal("helper did not exit on SIGTERM")
	}
	_, err = os.Lstat(h.socket)
	assert.True(t, errors.Is(err, os.ErrNotExist), "socket removed: %v", err)
}

// waitLog waits for a line of the helper's log.
func waitLog(t *testing.T, h *harness, what string) {
	t.Helper()
	deadline := time.Now().Add(callTimeout)
	for !strings.Contains(h.stderr.String(), what) {
		require.True(t, time.Now().Before(deadline), "the helper never logged %q", what)
		time.Sleep(10 * time.Millisecond)
	}
}

// waitExited polls isProcessRunning until the process has exited.
func waitExited(t *testing.T, c *client, id string) {
	t.Helper()
	deadline := time.Now().Add(callTimeout)
	for {
		var r struct {
			Running bool `json:"running"`
		}
		c.call("isProcessRunning", map[string]any{"id": id}, &r)
		if !r.Running {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s never exited", id)
		time.Sleep(20 * time.Millisecond)
	}
}

func waitConnected(t *testing.T, c *client) {
	t.Helper()
	waitConnectedEvery(t, c, 100*time.Millisecond) // the client polls a few times a second
}

// waitConnectedEvery is waitConnected polling every interval (a figure's
// finer clock).
func waitConnectedEvery(t *testing.T, c *client, interval time.Duration) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var r struct {
			Connected bool `json:"connected"`
		}
		c.call("isGuestConnected", nil, &r)
		if r.Connected {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the guest never connected")
		}
		time.Sleep(interval)
	}
}

// TestGuestDeath kills the process backend's sandbox from outside: the
// helper must report it (fatal error, exits), answer isGuestConnected
// truthfully, and boot again on the next startVM.
func TestGuestDeath(t *testing.T) {
	backend := os.Getenv("COWORK_VMM_E2E_BACKEND")
	if backend != "" && backend != "process" {
		t.Skip("kills the process backend's sandbox; other backends need their own way to crash a guest")
	}
	skipWithoutUserNamespaces(t)
	h := startHelper(t, "process")
	pipe, err := protocol.DialPipe(t.Context(), h.socket)
	require.NoError(t, err)
	defer pipe.Close()
	h.pipe = pipe
	h.call("configure", map[string]any{"userDataName": "p", "userDataRoot": "/r", "sessionOnly": true}, nil)
	ev := subscribe(t, h.socket, map[string]any{"userDataName": "p", "userDataRoot": "/r"})
	h.call("startVM", map[string]any{"bundlePath": ""}, nil)
	waitConnected(t, h.client)
	h.call("spawn", map[string]any{"id": "victim", "name": "s", "command": "/bin/sh", "args": []string{"-c", "echo up; sleep 1000"}}, nil)
	ev.wait("victim up", func(protocol.Event) bool {
		return strings.Contains(ev.outputLocked(protocol.EventStdout, "victim"), "up")
	})

	pid := sandboxPID(t, h.stderr.String())
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))

	fatal := ev.wait("fatal error", func(e protocol.Event) bool { return e.Type == protocol.EventError && e.Fatal != nil && *e.Fatal })
	assert.NotEmpty(t, fatal.Message)
	exit := ev.exit("victim")
	assert.NotEmpty(t, exit.Signal)
	deadline := time.Now().Add(callTimeout)
	for {
		var r struct {
			Running bool `json:"running"`
		}
		h.call("isRunning", nil, &r)
		if !r.Running {
			break
		}
		require.True(t, time.Now().Before(deadline), "isRunning stayed true after the guest died")
		time.Sleep(50 * time.Millisecond)
	}
	var c struct {
		Connected bool `json:"connected"`
	}
	h.call("isGuestConnected", nil, &c)
	assert.False(t, c.Connected)

	h.call("startVM", map[string]any{"bundlePath": ""}, nil)
	waitConnected(t, h.client)
	h.call("stopVM", nil, nil)
}

// sandboxPID finds the last sandbox pid the process backend logged.
func sandboxPID(t *testing.T, log string) int {
	t.Helper()
	pid := 0
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "process sandbox started") {
			continue
		}
		for _, field := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(field, "pid="); ok {
				n, err := strconv.Atoi(v)
				require.NoError(t, err)
				pid = n
			}
		}
	}
	require.NotZero(t, pid, "no sandbox pid in the helper's log:\n%s", log)
	return pid
}
