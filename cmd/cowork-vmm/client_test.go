package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// fakeHelper is a protocol.Handler that plays the helper's side of the
// methods the client uses, and records what it was sent.
type fakeHelper struct {
	mu            sync.Mutex
	calls         []string
	configures    []protocol.ConfigureParams
	startVMs      []protocol.StartVMParams
	spawns        []protocol.ClientSpawnParams
	stdin         []string
	running       bool
	polls         int
	connectAfter  int  // isGuestConnected turns true after this many polls
	neverConnects bool // it never does
	diesOnBoot    bool // isRunning turns false after startVM
	spawnError    string
	subs          map[chan protocol.Event]struct{}
	spawned       chan protocol.ClientSpawnParams
	// onSpawn publishes what the process does; nil: nothing happens.
	onSpawn func(f *fakeHelper, p protocol.ClientSpawnParams)
	// onKill answers a kill; nil: exit with that signal.
	onKill func(f *fakeHelper, p protocol.ClientKillParams)
	// onStdinEOF answers a writeStdin with eof; nil: nothing happens.
	onStdinEOF func(f *fakeHelper, id string)
}

func newFakeHelper() *fakeHelper {
	return &fakeHelper{subs: make(map[chan protocol.Event]struct{}), spawned: make(chan protocol.ClientSpawnParams, 8)}
}

func (f *fakeHelper) publish(ev protocol.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.subs {
		ch <- ev // buffered well beyond what a test publishes
	}
}

func (f *fakeHelper) Handle(_ context.Context, method string, params json.RawMessage) (any, error) {
	f.mu.Lock()
	f.calls = append(f.calls, method)
	f.mu.Unlock()
	switch method {
	case protocol.MethodConfigure:
		var p protocol.ConfigureParams
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, err
		}
		f.mu.Lock()
		f.configures = append(f.configures, p)
		f.mu.Unlock()
	case protocol.MethodIsRunning:
		f.mu.Lock()
		defer f.mu.Unlock()
		return protocol.IsRunningResult{Running: f.running}, nil
	case protocol.MethodStartVM:
		var p protocol.StartVMParams
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, err
		}
		f.mu.Lock()
		f.startVMs = append(f.startVMs, p)
		f.running = !f.diesOnBoot
		f.mu.Unlock()
	case protocol.MethodStopVM:
		f.mu.Lock()
		f.running = false
		f.mu.Unlock()
	case protocol.MethodIsGuestConnected:
		f.mu.Lock()
		defer f.mu.Unlock()
		f.polls++
		return protocol.IsGuestConnectedResult{Connected: f.running && !f.neverConnects && f.polls > f.connectAfter}, nil
	case protocol.MethodSpawn:
		var p protocol.ClientSpawnParams
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, err
		}
		if f.spawnError != "" {
			return nil, errors.New(f.spawnError)
		}
		f.mu.Lock()
		f.spawns = append(f.spawns, p)
		f.mu.Unlock()
		f.spawned <- p
		if f.onSpawn != nil {
			go f.onSpawn(f, p)
		}
		var res protocol.SpawnResult
		for name, m := range p.AdditionalMounts {
			if strings.Contains(m.Path, "missing") {
				res.FailedMounts = append(res.FailedMounts, name)
			}
		}
		return res, nil
	case protocol.MethodKill:
		var p protocol.ClientKillParams
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, err
		}
		if f.onKill != nil {
			f.onKill(f, p)
		} else {
			f.publish(protocol.Event{Type: protocol.EventExit, ID: p.ID, Signal: p.Signal})
		}
	case protocol.MethodWriteStdin:
		var p protocol.WriteStdinParams
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, err
		}
		f.mu.Lock()
		f.stdin = append(f.stdin, p.Data)
		f.mu.Unlock()
		if p.EOF && f.onStdinEOF != nil {
			f.onStdinEOF(f, p.ID)
		}
	}
	return nil, nil
}

func (f *fakeHelper) Subscribe(context.Context, json.RawMessage) (*protocol.Subscription, error) {
	ch := make(chan protocol.Event, 256)
	f.mu.Lock()
	f.subs[ch] = struct{}{}
	f.mu.Unlock()
	// A backlog event of an earlier run, which the client must ignore.
	ch <- protocol.Event{Type: protocol.EventStdout, ID: "client-earlier", Data: "not ours\n"}
	return &protocol.Subscription{Events: ch, Cancel: func() {
		f.mu.Lock()
		delete(f.subs, ch)
		f.mu.Unlock()
	}}, nil
}

func (f *fakeHelper) stdinChunks() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.stdin...)
}

func (f *fakeHelper) configured() []protocol.ConfigureParams {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.ConfigureParams(nil), f.configures...)
}

func (f *fakeHelper) spawnParams() []protocol.ClientSpawnParams {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.ClientSpawnParams(nil), f.spawns...)
}

func (f *fakeHelper) methods() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// serveFake serves f on a fresh socket and returns its path.
func serveFake(t *testing.T, f *fakeHelper) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cvc") // short: socket paths are limited to 108 bytes
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ln, err := protocol.Listen(filepath.Join(dir, "run", "h.sock"), log)
	require.NoError(t, err)
	srv := protocol.NewServer(protocol.ServerConfig{Handler: f, Logger: log})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
		assert.ErrorIs(t, <-served, protocol.ErrServerClosed)
		_ = ln.Close()
	})
	return ln.Path()
}

// clientRun runs the client against socket with args and returns its
// exit status, stdout and stderr (err included).
func clientRun(t *testing.T, socket string, tio clientIO, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	o, err := parseClientArgs(append([]string{"--socket", socket}, args...), &stderr, "unused")
	require.NoError(t, err)
	tio.stdout, tio.stderr = &stdout, &stderr
	code, err := runClient(context.Background(), o, tio)
	if err != nil {
		fmt.Fprintln(&stderr, "cowork-vmm client:", err)
	}
	return code, stdout.String(), stderr.String()
}

// exitWith publishes output then an exit code.
func exitWith(stdout, stderr string, code int) func(*fakeHelper, protocol.ClientSpawnParams) {
	return func(f *fakeHelper, p protocol.ClientSpawnParams) {
		f.publish(protocol.Event{Type: protocol.EventStdout, ID: "someone-else", Data: "other output\n"})
		f.publish(protocol.Event{Type: protocol.EventStdout, ID: p.ID, Data: stdout})
		f.publish(protocol.Event{Type: protocol.EventStderr, ID: p.ID, Data: stderr})
		f.publish(protocol.Event{Type: protocol.EventExit, ID: "someone-else", ExitCode: ptrTo(9)})
		f.publish(protocol.Event{Type: protocol.EventExit, ID: p.ID, ExitCode: ptrTo(code)})
	}
}

func ptrTo[T any](v T) *T { return &v }

func TestClientBootsTheGuestAndReturnsTheExitCode(t *testing.T) {
	f := newFakeHelper()
	f.connectAfter = 2
	f.onSpawn = exitWith("hi\n", "oops\n", 3)
	socket := serveFake(t, f)
	host := t.TempDir()

	code, stdout, stderr := clientRun(t, socket, clientIO{}, "--session", "s1", "--env", "A=b", "--workdir", "/sessions/s1/mnt/w",
		"--mount", host+":w", "--mount", filepath.Join(host, "missing")+":gone:ro", "--", "sh", "-c", "echo hi")
	assert.Equal(t, 3, code, stderr)
	assert.Equal(t, "hi\n", stdout, "only this process's output, not the backlog's or another process's")
	assert.Contains(t, stderr, "oops\n")
	assert.Contains(t, stderr, "--mount gone could not be made")

	// The desktop client's boot sequence, then the spawn; the guest is left running.
	calls := f.methods()
	assert.Equal(t, []string{"configure", "isRunning", "configure", "startVM"}, calls[:4])
	assert.Equal(t, "spawn", calls[len(calls)-1])
	assert.Contains(t, calls, "isGuestConnected")
	assert.NotContains(t, calls, "stopVM")
	configures := f.configured()
	require.Len(t, configures, 2)
	assert.True(t, configures[0].SessionOnly, "the pipe is configured first, as the client does")
	assert.False(t, configures[1].SessionOnly, "the full configure precedes startVM")

	spawns := f.spawnParams()
	require.Len(t, spawns, 1)
	sp := spawns[0]
	assert.True(t, strings.HasPrefix(sp.ID, "client-"), sp.ID)
	assert.Equal(t, "s1", sp.Name)
	assert.Equal(t, "sh", sp.Command)
	assert.Equal(t, []string{"-c", "echo hi"}, sp.Args)
	assert.Equal(t, "/sessions/s1/mnt/w", sp.Cwd)
	assert.Equal(t, map[string]string{"A": "b"}, sp.Env)
	assert.Equal(t, map[string]protocol.AdditionalMount{
		"w":    {Path: strings.TrimPrefix(host, "/"), Mode: protocol.MountModeRW},
		"gone": {Path: strings.TrimPrefix(filepath.Join(host, "missing"), "/"), Mode: protocol.MountModeRO},
	}, sp.AdditionalMounts)
}

func TestClientReusesARunningGuestAndStopsItWhenAsked(t *testing.T) {
	f := newFakeHelper()
	f.running = true
	f.onSpawn = exitWith("", "", 0)
	socket := serveFake(t, f)

	code, _, stderr := clientRun(t, socket, clientIO{}, "--stop-vm", "--", "true")
	assert.Equal(t, 0, code, stderr)
	calls := f.methods()
	assert.NotContains(t, calls, "startVM", "a running guest is used as it is")
	assert.Len(t, f.configured(), 1, "and not reconfigured")
	assert.Equal(t, "stopVM", calls[len(calls)-1], "--stop-vm stops it after the command")
	spawns := f.spawnParams()
	require.Len(t, spawns, 1)
	assert.Equal(t, defaultClientSession, spawns[0].Name)
	assert.Equal(t, []string{}, spawns[0].Args, "args is always an array")
}

func TestClientExitStatusOfASignal(t *testing.T) {
	f := newFakeHelper()
	f.running = true
	f.onSpawn = func(f *fakeHelper, p protocol.ClientSpawnParams) {
		f.publish(protocol.Event{Type: protocol.EventExit, ID: p.ID, Signal: "SIGTERM"})
	}
	code, _, _ := clientRun(t, serveFake(t, f), clientIO{}, "--", "sleep", "1000")
	assert.Equal(t, 128+int(syscall.SIGTERM), code)
}

func TestClientForwardsSignalsAndStdin(t *testing.T) {
	f := newFakeHelper()
	f.running = true
	sigs := make(chan os.Signal, 1)
	socket := serveFake(t, f)
	go func() {
		<-f.spawned
		sigs <- syscall.SIGINT
	}()
	const input = "héllo\n"
	f.onKill = func(f *fakeHelper, p protocol.ClientKillParams) {
		// Exit only once all of stdin has come (it is forwarded
		// concurrently), so the test sees all of it.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if strings.Join(f.stdinChunks(), "") == input {
				break
			}
		}
		f.publish(protocol.Event{Type: protocol.EventExit, ID: p.ID, Signal: p.Signal})
	}
	// One byte at a time: "é" arrives split, and must be sent whole.
	stdin := iotest.OneByteReader(strings.NewReader(input))
	code, _, _ := clientRun(t, socket, clientIO{signals: sigs, stdin: stdin}, "--", "cat")
	assert.Equal(t, 128+int(syscall.SIGINT), code, "the kill's exit (SIGINT) is the status")
	assert.Contains(t, f.methods(), "kill")
	chunks := f.stdinChunks()
	assert.Equal(t, input, strings.Join(chunks, ""))
	for _, chunk := range chunks {
		assert.True(t, utf8.ValidString(chunk), "chunk %q", chunk)
	}
}

// The end of the client's stdin reaches the process (writeStdin's eof): a
// cat ends, and the client with it, where before it waited for ever.
func TestClientForwardsEndOfInput(t *testing.T) {
	f := newFakeHelper()
	f.running = true
	socket := serveFake(t, f)
	f.onStdinEOF = func(f *fakeHelper, id string) {
		f.publish(protocol.Event{Type: protocol.EventStdout, ID: id, Data: strings.Join(f.stdinChunks(), "")})
		f.publish(protocol.Event{Type: protocol.EventExit, ID: id, ExitCode: ptrTo(0)})
	}
	type result struct {
		code   int
		stdout string
	}
	done := make(chan result, 1)
	go func() {
		code, stdout, _ := clientRun(t, socket, clientIO{stdin: strings.NewReader("all of it\n")}, "--", "cat")
		done <- result{code, stdout}
	}()
	select {
	case r := <-done:
		assert.Equal(t, 0, r.code)
		assert.Equal(t, "all of it\n", r.stdout)
	case <-time.After(10 * time.Second):
		t.Fatal("the client still runs 10 s after its stdin ended: the process never saw end of input")
	}
}

func TestClientSecondSignalGivesUpOnACommandThatDoesNotEnd(t *testing.T) {
	f := newFakeHelper()
	f.running = true
	f.onKill = func(*fakeHelper, protocol.ClientKillParams) {} // the guest never answers
	sigs := make(chan os.Signal, 2)
	socket := serveFake(t, f)
	go func() {
		<-f.spawned
		sigs <- syscall.SIGTERM
		for !slices.Contains(f.methods(), "kill") {
			time.Sleep(time.Millisecond)
		}
		sigs <- syscall.SIGTERM
	}()
	code, _, stderr := clientRun(t, socket, clientIO{signals: sigs}, "--", "sleep", "1000")
	assert.Equal(t, 128+int(syscall.SIGTERM), code)
	assert.Contains(t, stderr, "second signal")
	kills := 0
	for _, m := range f.methods() {
		if m == "kill" {
			kills++
		}
	}
	assert.Equal(t, 1, kills, "the first signal is forwarded, the second ends the wait")
}

func TestClientSignalBeforeTheCommandAbandons(t *testing.T) {
	f := newFakeHelper()
	f.neverConnects = true
	sigs := make(chan os.Signal, 1)
	sigs <- syscall.SIGINT
	code, _, stderr := clientRun(t, serveFake(t, f), clientIO{signals: sigs}, "--", "true")
	assert.Equal(t, 130, code)
	assert.Contains(t, stderr, "interrupted before the command started")
	assert.NotContains(t, f.methods(), "spawn")
}

func TestClientSpawnFailure(t *testing.T) {
	f := newFakeHelper()
	f.running = true
	f.spawnError = "spawn /nope: no such file or directory"
	code, _, stderr := clientRun(t, serveFake(t, f), clientIO{}, "--", "/nope")
	assert.Equal(t, 127, code)
	assert.Contains(t, stderr, "spawn /nope: no such file or directory")
}

func TestClientGuestThatNeverComesUp(t *testing.T) {
	f := newFakeHelper()
	f.diesOnBoot = true
	code, _, stderr := clientRun(t, serveFake(t, f), clientIO{}, "--", "true")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "the guest stopped before its agent connected")
	assert.Contains(t, stderr, "cowork-vmm doctor")

	f = newFakeHelper()
	f.neverConnects = true
	code, _, stderr = clientRun(t, serveFake(t, f), clientIO{}, "--timeout", "50ms", "--", "true")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "the guest did not come up within 50ms (--timeout)")
}

func TestClientHelperGoneMidCommand(t *testing.T) {
	f := newFakeHelper()
	f.running = true
	f.onSpawn = func(f *fakeHelper, p protocol.ClientSpawnParams) {
		f.mu.Lock()
		defer f.mu.Unlock()
		for ch := range f.subs {
			close(ch) // the producer ends the subscription: the server closes it
			delete(f.subs, ch)
		}
	}
	code, _, stderr := clientRun(t, serveFake(t, f), clientIO{}, "--", "true")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "the helper ended the event stream before the command exited")
}

func TestClientSocketErrors(t *testing.T) {
	dir, err := os.MkdirTemp("", "cvc")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	missing := filepath.Join(dir, "missing.sock")
	code, _, stderr := clientRun(t, missing, clientIO{}, "--", "true")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "no helper listening at "+missing+"; start one with `cowork-vmm -socket "+missing+"`")

	// A socket whose helper has exited.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	code, _, stderr = clientRun(t, stale, clientIO{}, "--", "true")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "no helper listening at "+stale+" (the socket is left over")

	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	code, _, stderr = clientRun(t, file, clientIO{}, "--", "true")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, file+" is not a socket")
}

// TestClientBundleIsStartVMsBundlePath: --bundle DIR reaches startVM as
// bundlePath, made absolute, as the desktop client passes its bundle.
func TestClientBundleIsStartVMsBundlePath(t *testing.T) {
	f := newFakeHelper()
	f.onSpawn = exitWith("", "", 0)
	socket := serveFake(t, f)
	t.Chdir(t.TempDir())
	code, _, stderr := clientRun(t, socket, clientIO{}, "--bundle", "vm_bundle", "--", "true")
	require.Equal(t, 0, code, stderr)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.startVMs, 1)
	wd, err := os.Getwd()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(wd, "vm_bundle"), f.startVMs[0].BundlePath)
}

func TestParseClientArgs(t *testing.T) {
	o, err := parseClientArgs([]string{"--", "uname", "-a"}, io.Discard, "/run/user/1/claude-cowork-vm.sock")
	require.NoError(t, err)
	assert.Equal(t, "/run/user/1/claude-cowork-vm.sock", o.socket)
	assert.Equal(t, defaultClientSession, o.session)
	assert.Equal(t, bootTimeout, o.timeout)
	assert.False(t, o.stopVM)
	assert.Equal(t, []string{"uname", "-a"}, o.command)

	for _, args := range [][]string{
		{},
		{"--timeout", "0", "--", "true"},
		{"--workdir", "rel", "--", "true"},
		{"--session", "", "--", "true"},
		{"--mount", "/a:w", "--mount", "/b:w", "--", "true"},
		{"--env", "novalue", "--", "true"},
	} {
		_, err := parseClientArgs(args, io.Discard, "/s")
		assert.Error(t, err, args)
	}
}

func TestParseClientMount(t *testing.T) {
	name, m, err := parseClientMount("/src:work")
	require.NoError(t, err)
	assert.Equal(t, "work", name)
	assert.Equal(t, protocol.AdditionalMount{Path: "src", Mode: protocol.MountModeRW}, m)
	name, m, err = parseClientMount("/etc:.claude/skills:ro")
	require.NoError(t, err)
	assert.Equal(t, ".claude/skills", name)
	assert.Equal(t, protocol.AdditionalMount{Path: "etc", Mode: protocol.MountModeRO}, m)
	_, m, err = parseClientMount("rel:r")
	require.NoError(t, err)
	wd, _ := os.Getwd()
	assert.Equal(t, strings.TrimPrefix(filepath.Join(wd, "rel"), "/"), m.Path, "a relative HOST is made absolute")
	for _, bad := range []string{"/src", ":w", "/src:", "/src:/abs", "/src:../up", "/src:a/../b", "/src:.", "/a:b:rx", "/a:b:ro:x"} {
		_, _, err := parseClientMount(bad)
		assert.Error(t, err, bad)
	}
}

func TestDefaultSocketPath(t *testing.T) {
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	assert.Equal(t, "/run/user/1000/claude-cowork-vm.sock", defaultSocketPath(env(map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000"}), 1000))
	assert.Equal(t, "/tmp/claude-cowork-1000/claude-cowork-vm.sock", defaultSocketPath(env(nil), 1000))
	assert.Equal(t, "/var/tmp/claude-cowork-7/claude-cowork-vm.sock", defaultSocketPath(env(map[string]string{"TMPDIR": "/var/tmp"}), 7))
}

func TestCompleteUTF8(t *testing.T) {
	e := []byte("é")     // 2 bytes
	euro := []byte("€")  // 3 bytes
	emoji := []byte("😀") // 4 bytes
	assert.Equal(t, 0, completeUTF8(nil))
	assert.Equal(t, 3, completeUTF8([]byte("abc")))
	assert.Equal(t, 1, completeUTF8([]byte{'a', e[0]}))
	assert.Equal(t, 3, completeUTF8(append([]byte("a"), e...)))
	assert.Equal(t, 1, completeUTF8(append([]byte("a"), euro[:2]...)))
	assert.Equal(t, 1, completeUTF8(append([]byte("a"), emoji[:3]...)))
	assert.Equal(t, 5, completeUTF8(append([]byte("a"), emoji...)))
	assert.Equal(t, 2, completeUTF8([]byte{'a', 0x80}), "a stray continuation byte is not held")
}

func TestClientHelp(t *testing.T) {
	var out bytes.Buffer
	assert.Equal(t, 0, dispatch([]string{"client", "--help"}, io.Discard, &out))
	for _, want := range []string{"--socket PATH", "claude-cowork-vm.sock", "--session NAME", "--mount HOST:NAME[:ro]", "--timeout D", "--stop-vm", "cowork-vmm client -- uname -a"} {
		assert.Contains(t, out.String(), want)
	}
	out.Reset()
	assert.Equal(t, 0, dispatch([]string{"help"}, &out, io.Discard))
	assert.Contains(t, out.String(), "cowork-vmm client [flags] -- CMD")
	var errOut bytes.Buffer
	assert.Equal(t, 2, dispatch([]string{"client"}, io.Discard, &errOut))
	assert.Contains(t, errOut.String(), "no command given")
}
