package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
	"github.com/cowork-vmm/cowork-vmm/testharness/sandboxprobe"
)

// testAgentEnv makes the test binary act as `cowork-vmm agent`, and
// testGuestRequestEnv as `cowork-vmm guest-request` (see TestMain).
const (
	testAgentEnv        = "COWORK_VMM_AGENT_TEST_CHILD"
	testGuestRequestEnv = "COWORK_VMM_GUEST_REQUEST_TEST_CHILD"
)

func TestMain(m *testing.M) {
	if os.Getenv(testProbeEnv) == "1" { // a spawn looking around (confine_test.go)
		sandboxprobe.Run(os.Stdout, false)
		os.Exit(0)
	}
	if os.Getenv(testAgentEnv) == "1" {
		os.Exit(ProcessMain(os.Args[1:]))
	}
	if os.Getenv(testGuestRequestEnv) == "1" { // as GuestToolPath is run
		args := os.Args[1:]
		switch {
		case filepath.Base(os.Args[0]) == "sudo":
			os.Exit(SudoMain(args, os.Stderr))
		case len(args) > 0 && args[0] == "root-exec":
			os.Exit(RootExecMain(args[1:], os.Stderr))
		case len(args) > 0 && args[0] == "guest-request":
			args = args[1:]
		}
		os.Exit(GuestRequestMain(args, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// testClient is agenttest.Client with this package's helpers.
type testClient struct {
	*agenttest.Client
	t testing.TB
}

func newTestClient(t testing.TB, conn net.Conn) *testClient {
	return &testClient{Client: agenttest.Dial(t, conn), t: t}
}

// startAgent runs agent.Run in this process over a socketpair.
func startAgent(t testing.TB, opts Options) *testClient {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	agentConn := fileConn(t, fds[0])
	clientConn := fileConn(t, fds[1])
	if opts.RunDir == "" {
		opts.RunDir = t.TempDir()
	}
	runErr := make(chan error, 1)
	go func() { runErr <- Run(context.Background(), agentConn, opts) }()
	c := newTestClient(t, clientConn)
	t.Cleanup(func() {
		clientConn.Close()
		select {
		case <-runErr:
		case <-time.After(30 * time.Second):
			t.Error("agent.Run did not return after the connection closed")
		}
	})
	return c
}

func fileConn(t testing.TB, fd int) net.Conn {
	f := os.NewFile(uintptr(fd), "socket")
	defer f.Close()
	c, err := net.FileConn(f)
	require.NoError(t, err)
	return c
}

func (c *testClient) spawn(id string, args ...string) {
	c.t.Helper()
	require.NoError(c.t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: id, Command: args[0], Args: args[1:], Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"},
	}, nil))
}

func TestHelloAndPing(t *testing.T) {
	c := startAgent(t, Options{})
	require.Equal(t, os.Getpid(), c.Hello().PID)
	require.NoError(t, c.Call(protocol.AgentMethodPing, nil, nil))
	require.ErrorContains(t, c.Call("frobnicate", nil, nil), "unknown agent method")
}

func TestSpawnOutputAndExitCode(t *testing.T) {
	c := startAgent(t, Options{})
	c.spawn("p1", "sh", "-c", "echo out; echo err >&2; exit 3")
	p := c.WaitExit("p1")
	require.Equal(t, "out\n", p.Stdout.String())
	require.Equal(t, "err\n", p.Stderr.String())
	require.NotNil(t, p.Exit.ExitCode)
	require.Equal(t, 3, *p.Exit.ExitCode)
	require.Empty(t, p.Exit.Signal)
}

func TestSpawnUsesArgsCwdAndEnvExactly(t *testing.T) {
	c := startAgent(t, Options{})
	dir := t.TempDir()
	require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "env", Command: "sh", Args: []string{"-c", `pwd; echo "$FOO"; env | wc -l; echo "$1"`, "sh", "two words"},
		Cwd: dir, Env: []string{"PATH=/usr/bin:/bin", "FOO=bar baz"},
	}, nil))
	p := c.WaitExit("env")
	lines := strings.Split(strings.TrimSpace(p.Stdout.String()), "\n")
	require.Len(t, lines, 4, p.Stdout.String())
	require.Equal(t, dir, lines[0])
	require.Equal(t, "bar baz", lines[1])
	// PATH, FOO and the PWD sh sets itself (plus SHLVL/_ on some shells).
	n, err := strconv.Atoi(strings.TrimSpace(lines[2]))
	require.NoError(t, err)
	require.LessOrEqual(t, n, 5)
	require.Equal(t, "two words", lines[3])
}

func TestSpawnErrors(t *testing.T) {
	c := startAgent(t, Options{})
	err := c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: "x", Command: "no-such-command-here", Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}}, nil)
	require.ErrorContains(t, err, "not found in PATH")
	err = c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: "x", Command: "true", Cwd: "/no/such/dir", Env: []string{"PATH=/usr/bin:/bin"}}, nil)
	require.ErrorContains(t, err, "working directory")
	err = c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: "", Command: "true"}, nil)
	require.ErrorContains(t, err, "process id")
	// A running id cannot be reused.
	c.spawn("dup", "sleep", "30")
	err = c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: "dup", Command: "true", Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}}, nil)
	require.ErrorContains(t, err, "still running")
	require.NoError(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "dup", Signal: "SIGKILL"}, nil))
	require.Equal(t, "SIGKILL", c.WaitExit("dup").Exit.Signal)
}

func TestUnknownProcessAndSignal(t *testing.T) {
	c := startAgent(t, Options{})
	require.ErrorContains(t, c.Call(protocol.AgentMethodStdin, protocol.StdinParams{ID: "nope", Data: "x"}, nil), "no running process")
	require.ErrorContains(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "nope", Signal: "SIGTERM"}, nil), "no running process")
	c.spawn("s", "sleep", "30")
	require.ErrorContains(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "s", Signal: "SIGBOGUS"}, nil), "unknown signal")
	require.NoError(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "s", Signal: "SIGINT"}, nil))
	require.Equal(t, "SIGINT", c.WaitExit("s").Exit.Signal)
}

func TestUTF8SplitAcrossWritesIsReassembled(t *testing.T) {
	c := startAgent(t, Options{})
	// The euro sign's three bytes are written separately, with pauses longer
	// than the coalescing window, then an invalid byte.
	c.spawn("u", "sh", "-c", `printf '\342'; sleep 0.1; printf '\202'; sleep 0.1; printf '\254 ok \377!'`)
	p := c.WaitExit("u")
	require.Equal(t, "€ ok \uFFFD!", p.Stdout.String())
}

func TestLargeOutputArrivesCompleteInBoundedChunks(t *testing.T) {
	c := startAgent(t, Options{})
	const size = 20 * 1024 * 1024
	c.spawn("big", "sh", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\000' a; echo done >&2", size))
	p := c.WaitExit("big")
	require.Equal(t, size, p.Stdout.Len())
	require.Equal(t, strings.Repeat("a", 100), p.Stdout.String()[size-100:])
	require.Equal(t, "done\n", p.Stderr.String())
	for _, n := range p.Chunks {
		require.LessOrEqual(t, n, maxChunkBytes+utf8.UTFMax)
	}
	require.GreaterOrEqual(t, len(p.Chunks), size/maxChunkBytes)
	// Coalescing: far fewer events than the pipe's 4 KiB writes would give.
	require.Less(t, len(p.Chunks), size/4096)
}

func TestStdinRoundTripAndKill(t *testing.T) {
	c := startAgent(t, Options{})
	c.spawn("cat", "cat")
	require.NoError(t, c.Call(protocol.AgentMethodStdin, protocol.StdinParams{ID: "cat", Data: "hello ünïcode\n"}, nil))
	c.WaitFor("cat", "echoed stdin", func(p *agenttest.Output) bool { return p.Stdout.String() == "hello ünïcode\n" })
	require.NoError(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "cat", Signal: "SIGTERM"}, nil))
	p := c.WaitExit("cat")
	require.Equal(t, "SIGTERM", p.Exit.Signal)
	require.Nil(t, p.Exit.ExitCode)
	// Once exited, the id is unknown.
	require.Error(t, c.Call(protocol.AgentMethodStdin, protocol.StdinParams{ID: "cat", Data: "x"}, nil))
}

func TestKillSignalsTheWholeGroup(t *testing.T) {
	c := startAgent(t, Options{})
	// The shell waits for its child; SIGTERM to the group ends both.
	c.spawn("grp", "sh", "-c", "sleep 30; echo not reached")
	require.NoError(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "grp", Signal: "TERM"}, nil))
	p := c.WaitExit("grp")
	require.Equal(t, "SIGTERM", p.Exit.Signal)
	require.Empty(t, p.Stdout.String())
}

func TestOrphansAreReaped(t *testing.T) {
	c := startAgent(t, Options{Subreaper: true})
	c.spawn("orph", "sh", "-c", "sleep 0.3 </dev/null >/dev/null 2>&1 & echo $!")
	p := c.WaitExit("orph")
	require.Equal(t, 0, *p.Exit.ExitCode)
	pid, err := strconv.Atoi(strings.TrimSpace(p.Stdout.String()))
	require.NoError(t, err)
	// The grandchild is reparented to us (subreaper); once it ends it must be
	// reaped rather than linger as a zombie.
	deadline := time.Now().Add(20 * time.Second)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d was not reaped: %s", pid, stat)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestExitWaitsForOutputButNotForeverForBackgroundHolders(t *testing.T) {
	c := startAgent(t, Options{OutputDrain: 200 * time.Millisecond})
	// The background sleep keeps stdout open; the exit still comes.
	c.spawn("bg", "sh", "-c", "echo first; sleep 30 & echo $! >&2")
	p := c.WaitExit("bg")
	require.Equal(t, "first\n", p.Stdout.String())
	require.Equal(t, 0, *p.Exit.ExitCode)
	bg, err := strconv.Atoi(strings.TrimSpace(p.Stderr.String()))
	require.NoError(t, err)
	require.NoError(t, unix.Kill(bg, unix.SIGKILL))
}

func TestOutputDrainNeverCutsFlowingOutput(t *testing.T) {
	c := startAgent(t, Options{OutputDrain: 50 * time.Millisecond})
	// Small enough that the process can write it all into the socket and
	// pipe buffers and exit while the agent is blocked sending.
	const size = 288 * 1024
	done := filepath.Join(t.TempDir(), "done")
	c.spawn("slow", "sh", "-c", fmt.Sprintf("sleep 0.2; head -c %d /dev/zero | tr '\\000' b; touch %s", size, done))
	// Stall the client until the process has exited and well past
	// OutputDrain, so the agent's sends are blocked meanwhile.
	c.Locked(func(map[string]*agenttest.Output) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := os.Stat(done); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the process did not finish while the client was stalled")
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
	})
	p := c.WaitExit("slow")
	require.Equal(t, size, p.Stdout.Len())
}

func TestReadFile(t *testing.T) {
	sessions := t.TempDir()
	c := startAgent(t, Options{SessionsDir: sessions})
	dir := filepath.Join(sessions, "s")
	other := filepath.Join(sessions, "other")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	require.NoError(t, os.Mkdir(other, 0o755))
	path := filepath.Join(dir, "f.bin")
	content := []byte{0, 1, 2, 0xff, 'x'}
	require.NoError(t, os.WriteFile(path, content, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(other, "secret"), []byte("other session's"), 0o644))
	read := func(p string) ([]byte, error) {
		var res protocol.ReadFileResult
		err := c.Call(protocol.AgentMethodReadFile, protocol.ReadFileParams{Path: p}, &res)
		return res.Content, err
	}
	got, err := read(path)
	require.NoError(t, err)
	require.Equal(t, content, got)

	_, err = read(filepath.Join(dir, "sub"))
	require.ErrorContains(t, err, "not a regular file")
	_, err = read("relative")
	require.ErrorContains(t, err, "absolute")
	_, err = read(filepath.Join(dir, "missing"))
	require.ErrorContains(t, err, "no such file")
	for _, outside := range []string{"/etc/hostname", dir, sessions + "/s/../../etc/passwd"} {
		_, err = read(outside)
		require.ErrorContains(t, err, "readFile reads only files inside a session's home", outside)
	}
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, unix.Mkfifo(fifo, 0o644))
	_, err = read(fifo)
	require.ErrorContains(t, err, "not a regular file")
	// A symlink that stays in the home is followed; one that leads out of
	// it (another session, /, a /proc magic link) is refused.
	require.NoError(t, os.Symlink("f.bin", filepath.Join(dir, "plain-link")))
	require.NoError(t, os.Symlink("../f.bin", filepath.Join(dir, "sub", "up-link")))
	for _, link := range []string{"plain-link", "sub/up-link"} {
		got, err = read(filepath.Join(dir, link))
		require.NoError(t, err, link)
		require.Equal(t, content, got, link)
	}
	for link, target := range map[string]string{
		"to-other": "../other/secret", "to-other-abs": filepath.Join(other, "secret"),
		"to-root": "/etc/hostname", "magic-link": "/proc/self/root" + path,
	} {
		require.NoError(t, os.Symlink(target, filepath.Join(dir, link)))
		_, err = read(filepath.Join(dir, link))
		require.Error(t, err, link)
	}
	_, err = read(filepath.Join(dir, "to-other"))
	require.ErrorContains(t, err, "leads out of session s's home")
	// The home itself swapped for a symlink to another session is refused.
	require.NoError(t, os.Symlink(other, filepath.Join(sessions, "swapped")))
	_, err = read(filepath.Join(sessions, "swapped", "secret"))
	require.Error(t, err)
	big := filepath.Join(dir, "big")
	require.NoError(t, os.WriteFile(big, make([]byte, protocol.MaxReadFileBytes+1), 0o644))
	_, err = read(big)
	require.ErrorContains(t, err, "more than")
}

func TestShutdownEndsProcessesThenReplies(t *testing.T) {
	c := startAgent(t, Options{})
	c.spawn("long", "sleep", "60")
	// A process that ignores SIGTERM needs the SIGKILL after the grace.
	c.spawn("stubborn", "sh", "-c", "trap '' TERM; echo ready; sleep 60")
	c.WaitFor("stubborn", "ready", func(p *agenttest.Output) bool { return p.Stdout.String() == "ready\n" })
	require.NoError(t, c.Call(protocol.AgentMethodShutdown, protocol.ShutdownParams{GraceMillis: 300}, nil))
	// The exit events were sent before the reply.
	var long, stubborn *agenttest.Output
	c.Locked(func(procs map[string]*agenttest.Output) { long, stubborn = procs["long"], procs["stubborn"] })
	require.NotNil(t, long)
	require.NotNil(t, long.Exit)
	require.Equal(t, "SIGTERM", long.Exit.Signal)
	require.NotNil(t, stubborn)
	require.NotNil(t, stubborn.Exit)
	require.Equal(t, "SIGKILL", stubborn.Exit.Signal)
	// The agent then closes the connection.
	c.WaitClosed()
}

func TestMountValidation(t *testing.T) {
	c := startAgent(t, Options{})
	for _, m := range []protocol.Mount{
		{Source: protocol.MountSource{Kind: "bind", Path: "/tmp"}, Target: "relative"},
		{Source: protocol.MountSource{Kind: "bind", Path: "/tmp"}, Target: "/a/../b"},
		{Source: protocol.MountSource{Kind: "bind", Path: "/tmp"}, Target: "/"},
		{Source: protocol.MountSource{Kind: "9p", Tag: "t", Aname: "x,ro=0"}, Target: "/x"},
		{Source: protocol.MountSource{Kind: "9p", Tag: "t", Aname: "../x"}, Target: "/x"},
		{Source: protocol.MountSource{Kind: "9p", Tag: "t", Aname: ".."}, Target: "/x"},
		{Source: protocol.MountSource{Kind: "9p", Tag: "t"}, Target: "/x"},
		{Source: protocol.MountSource{Kind: "nfs"}, Target: "/x"},
		{Source: protocol.MountSource{Kind: "bind", Path: "/tmp"}, Target: "/x", SourceFile: "../etc/shadow"},
	} {
		require.Error(t, c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: m}, nil), "%+v", m)
	}
}

// startChildAgent runs the agent in a re-executed test binary in new mount
// and PID namespaces (root only), as the process backend does without the
// user namespace; args are added to its command line, and extra are its
// descriptors 4 and on.
func startChildAgent(t *testing.T, args []string, extra ...*os.File) *testClient {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for mount namespaces")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	child := os.NewFile(uintptr(fds[0]), "agent-end")
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, append([]string{"--fd", "3", "--run-dir", t.TempDir()}, args...)...)
	cmd.Env = append(os.Environ(), testAgentEnv+"=1")
	cmd.ExtraFiles = append([]*os.File{child}, extra...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID, Pdeathsig: unix.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot create namespaces here: %v", err)
	}
	child.Close()
	conn := fileConn(t, fds[1])
	c := newTestClient(t, conn)
	t.Cleanup(func() {
		_ = c.Call(protocol.AgentMethodShutdown, protocol.ShutdownParams{GraceMillis: 500}, nil)
		conn.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			require.NoError(t, err, "agent exit status")
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("agent did not exit after shutdown")
		}
	})
	return c
}

func TestChildAgentIsPID1AndMountsBindReadOnly(t *testing.T) {
	c := startChildAgent(t, nil)
	require.Equal(t, 1, c.Hello().PID)
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "hello"), []byte("from host"), 0o644))
	ro := filepath.Join(t.TempDir(), "ro")
	rw := filepath.Join(t.TempDir(), "nested", "rw")
	require.NoError(t, c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
		Source: protocol.MountSource{Kind: "bind", Path: src}, Target: ro, ReadOnly: true}}, nil))
	// Idempotent for the same spec.
	require.NoError(t, c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
		Source: protocol.MountSource{Kind: "bind", Path: src}, Target: ro, ReadOnly: true}}, nil))
	require.NoError(t, c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
		Source: protocol.MountSource{Kind: "bind", Path: src}, Target: rw}}, nil))

	c.spawn("w", "sh", "-c", fmt.Sprintf("cat %s/hello; echo; (echo x > %s/new) || echo refused; echo y > %s/written && echo written", ro, ro, rw))
	p := c.WaitExit("w")
	require.Contains(t, p.Stdout.String(), "from host\nrefused\nwritten\n")
	require.Contains(t, p.Stderr.String(), "Read-only file system")
	got, err := os.ReadFile(filepath.Join(src, "written"))
	require.NoError(t, err)
	require.Equal(t, "y\n", string(got))
	_, err = os.Stat(filepath.Join(src, "new"))
	require.ErrorIs(t, err, os.ErrNotExist)
	// The mounts stayed inside the agent's namespace.
	entries, err := os.ReadDir(ro)
	require.NoError(t, err)
	require.Empty(t, entries)
}

func TestChildAgentFileMountOverReadOnlyDirectory(t *testing.T) {
	c := startChildAgent(t, nil)
	// A read-only directory with existing entries, like /usr/local/bin in a
	// read-only /usr.
	sys := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(sys, "existing"), []byte("#!/bin/sh\necho existing\n"), 0o755))
	require.NoError(t, os.Symlink("existing", filepath.Join(sys, "link")))
	require.NoError(t, os.Mkdir(filepath.Join(sys, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sys, "sub", "inner"), []byte("#!/bin/sh\necho inner\n"), 0o755))
	bin := filepath.Join(t.TempDir(), "bin")
	require.NoError(t, c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
		Source: protocol.MountSource{Kind: "bind", Path: sys}, Target: bin, ReadOnly: true}}, nil))
	sdk := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(sdk, "1.0"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sdk, "1.0", "claude"), []byte("#!/bin/sh\necho sdk \"$@\"\n"), 0o755))
	require.NoError(t, c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
		Source: protocol.MountSource{Kind: "bind", Path: filepath.Join(sdk, "1.0")}, SourceFile: "claude",
		Target: filepath.Join(bin, "claude"), ReadOnly: true}}, nil))
	c.spawn("run", "sh", "-c", fmt.Sprintf("%s/claude a b; %s/existing; %s/link; %s/sub/inner; echo x > %s/claude || echo refused", bin, bin, bin, bin, bin))
	p := c.WaitExit("run")
	require.Equal(t, "sdk a b\nexisting\nexisting\ninner\nrefused\n", p.Stdout.String(), p.Stderr.String())
	// Nothing leaked into the host directory.
	_, err := os.Stat(filepath.Join(sys, "claude"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestConsoleLogLevel: in the VM the agent logs warnings and errors to the
// serial console, and everything only when the kernel command line has the
// word cowork.debug.
func TestConsoleLogLevel(t *testing.T) {
	for cmdline, want := range map[string]slog.Level{
		"console=ttyS0 panic=-1 quiet":              slog.LevelWarn,
		"console=ttyS0 quiet cowork.debug panic=-1": slog.LevelDebug,
		"cowork.debug":            slog.LevelDebug,
		"cowork.debugger=1 quiet": slog.LevelWarn,
		"":                        slog.LevelWarn,
	} {
		require.Equal(t, want, consoleLogLevel(cmdline), "cmdline %q", cmdline)
	}
}
