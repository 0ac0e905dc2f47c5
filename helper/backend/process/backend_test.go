package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/guest/agent"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
	"github.com/cowork-vmm/cowork-vmm/testharness/sandboxprobe"
)

// testAgentEnv makes the re-executed test binary act as `cowork-vmm agent`.
const testAgentEnv = "COWORK_VMM_PROCESS_TEST_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(testProbeEnv) == "1" { // a spawn looking around (escape_test.go)
		sandboxprobe.Run(os.Stdout, true)
		os.Exit(0)
	}
	if os.Getenv(testLastWordsEnv) == "1" { // an agent that writes and exits (TestAgentsLastFramesAreReadable)
		os.Exit(writeLastWords())
	}
	if os.Getenv(testAgentEnv) == "1" && len(os.Args) > 1 && os.Args[1] == "agent" {
		os.Exit(agent.ProcessMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// client is agenttest.Client with the sandbox tests' helpers.
type client struct {
	*agenttest.Client
	t *testing.T
}

func newClient(t *testing.T, conn io.ReadWriteCloser) *client {
	return &client{Client: agenttest.Dial(t, conn), t: t}
}

// call sends a request that has no result.
func (c *client) call(method string, params any) error {
	c.t.Helper()
	return c.Call(method, params, nil)
}

// run spawns a shell command and waits for its exit.
func (c *client) run(id, script string) *agenttest.Output {
	c.t.Helper()
	require.NoError(c.t, c.call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: id, Command: "sh", Args: []string{"-c", script}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin"},
	}))
	return c.WaitExit(id)
}

// startSandbox starts the backend with this test binary as the agent and
// lays out the guest root with the host's system directories.
func startSandbox(t *testing.T) (helper.Guest, *client) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	b := New(Options{Executable: exe, Env: []string{testAgentEnv + "=1"}, StopGrace: 5 * time.Second})
	require.Equal(t, "process", b.Name())
	var steps []string
	g, err := b.Start(context.Background(), helper.GuestConfig{StepFunc: func(step, status string) { steps = append(steps, step+":"+status) }})
	if err != nil && (errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC)) {
		t.Skipf("user namespaces unavailable here: %v", err)
	}
	require.NoError(t, err)
	require.Equal(t, []string{"sandbox:started", "sandbox:completed"}, steps)
	t.Cleanup(func() { _ = g.Stop(context.Background()) })
	conn, err := g.Agent(context.Background())
	require.NoError(t, err)
	_, err = g.Agent(context.Background())
	require.Error(t, err, "the connection is handed out once")
	c := newClient(t, conn)
	require.Equal(t, 1, c.Hello().PID, "the agent is PID 1 of its namespace")

	setup := protocol.SetupParams{NewRoot: true, Hostname: "cowork"}
	for _, dir := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt"} {
		if _, err := os.Lstat(dir); err != nil {
			continue
		}
		src, err := g.Share(dir, true)
		require.NoError(t, err)
		setup.System = append(setup.System, protocol.Mount{Source: src, Target: dir, ReadOnly: true})
	}
	require.NoError(t, c.call(protocol.AgentMethodSetup, setup))
	return g, c
}

// hostEtcFile names a world-readable regular file of the host's /etc that
// the guest's read-only /etc must show (not /etc/.pwd.lock, mode 0600,
// which the sandbox of a user who is not root cannot read).
func hostEtcFile(t *testing.T) string {
	t.Helper()
	entries, err := os.ReadDir("/etc")
	require.NoError(t, err)
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if info, err := e.Info(); err == nil && info.Mode().Perm()&0o004 != 0 {
			return "/etc/" + e.Name()
		}
	}
	t.Skip("the host's /etc holds no world-readable regular file")
	return ""
}

func TestSandboxRootHidesTheHost(t *testing.T) {
	etcFile := hostEtcFile(t)
	_, c := startSandbox(t)
	r := c.run("look", `ls -a /; id -u; hostname; cat '`+etcFile+`' >/dev/null && echo etc-ok
		for p in /home /root /var /work /.host/etc /.host/home; do test -e $p && echo VISIBLE $p; done
		ls -A /run 2>/dev/null | grep -vx cowork | sed 's|^|VISIBLE /run/|' # only the agent's own /run/cowork
		ls -A /.host | sed 's/^/HOSTROOT /'
		for f in /proc/1/fd/*; do ls "$f/" >/dev/null 2>&1 && echo AGENT-FD-VISIBLE $f; readlink "$f" && echo AGENT-FD-VISIBLE $f; done
		ls /proc/1/root/.host/ 2>/dev/null | sed 's/^/ROOT /'
		umount /.host 2>/dev/null && echo UNCOVERED
		echo x > /usr/x 2>/dev/null && echo USR-WRITABLE
		echo tmp > /tmp/t && cat /tmp/t`)
	require.Equal(t, 0, *r.Exit.ExitCode, r.Stderr.String())
	lines := strings.Split(strings.TrimSpace(r.Stdout.String()), "\n")
	require.Contains(t, lines, "0", "root inside")
	require.Contains(t, lines, "cowork", "hostname")
	require.Contains(t, lines, "etc-ok")
	require.Contains(t, lines, "tmp")
	for _, l := range lines {
		require.NotRegexp(t, `^(VISIBLE|HOSTROOT|AGENT-FD-VISIBLE|ROOT|UNCOVERED|USR-WRITABLE)`, l)
	}
	var root []string
	for _, l := range lines {
		if l == "0" {
			break
		}
		root = append(root, l)
	}
	// /run is the agent's own (guest-request sockets; checked above to
	// hold nothing else), not the host's.
	for _, name := range root {
		require.NotContains(t, []string{"home", "root", "var", "work", "srv", "mnt", "boot"}, name, "ls / = %v", root)
	}
	require.True(t, slices.Contains(root, "sessions") && slices.Contains(root, "usr") && slices.Contains(root, "proc"), "ls / = %v", root)
}

func TestSandboxMountsAndProcesses(t *testing.T) {
	g, c := startSandbox(t)
	home := t.TempDir() // under the host's /tmp, which the guest's /tmp hides
	ro := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ro, "readme"), []byte("read me"), 0o644))

	src, err := g.Share(home, false)
	require.NoError(t, err)
	require.NoError(t, c.call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{Source: src, Target: "/sessions/s1"}}))
	src, err = g.Share(ro, true)
	require.NoError(t, err)
	require.NoError(t, c.call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{Source: src, Target: "/sessions/s1/mnt/.claude/skills", ReadOnly: true}}))

	// The SDK, a single file, lands in the read-only /usr.
	sdk := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(sdk, "2.0.1"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sdk, "2.0.1", "claude"), []byte("#!/bin/sh\necho \"claude $*\"\n"), 0o755))
	src, err = g.Share(filepath.Join(sdk, "2.0.1"), true)
	require.NoError(t, err)
	require.NoError(t, c.call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
		Source: src, SourceFile: "claude", Target: "/usr/local/bin/claude", ReadOnly: true}}))

	r := c.run("w", `cd /sessions/s1 && echo from-guest > out.txt && echo wrote
		cat mnt/.claude/skills/readme; echo
		(echo no > mnt/.claude/skills/new) 2>&1 | grep -q 'Read-only file system' && echo refused
		/usr/local/bin/claude --version`)
	require.Equal(t, "wrote\nread me\nrefused\nclaude --version\n", r.Stdout.String(), r.Stderr.String())
	data, err := os.ReadFile(filepath.Join(home, "out.txt"))
	require.NoError(t, err)
	require.Equal(t, "from-guest\n", string(data))
	st, err := os.Stat(filepath.Join(home, "out.txt"))
	require.NoError(t, err)
	require.Equal(t, uint32(os.Getuid()), st.Sys().(*syscall.Stat_t).Uid, "owned by the helper's user on the host")
	_, err = os.Stat(filepath.Join(ro, "new"))
	require.ErrorIs(t, err, os.ErrNotExist)

	// A mount added while a process runs (mountPath) reaches that process.
	late := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(late, "late.txt"), []byte("late"), 0o644))
	require.NoError(t, c.call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: "waiter", Command: "sh",
		Args: []string{"-c", "read line; cat /sessions/s1/mnt/late/late.txt"}, Cwd: "/sessions/s1", Env: []string{"PATH=/usr/bin:/bin"}}))
	src, err = g.Share(late, true)
	require.NoError(t, err)
	require.NoError(t, c.call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{Source: src, Target: "/sessions/s1/mnt/late", ReadOnly: true}}))
	require.NoError(t, c.call(protocol.AgentMethodStdin, protocol.StdinParams{ID: "waiter", Data: "go\n"}))
	r = c.WaitExit("waiter")
	require.Equal(t, "late", r.Stdout.String(), r.Stderr.String())

	// kill → exit with the signal name.
	require.NoError(t, c.call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: "sl", Command: "sleep", Args: []string{"60"}, Cwd: "/sessions/s1", Env: []string{"PATH=/usr/bin:/bin"}}))
	require.NoError(t, c.call(protocol.AgentMethodKill, protocol.KillParams{ID: "sl", Signal: "SIGTERM"}))
	require.Equal(t, "SIGTERM", c.WaitExit("sl").Exit.Signal)

	// Orphans are reaped by the agent as PID 1.
	r = c.run("orph", "sleep 0.2 </dev/null >/dev/null 2>&1 & echo $!")
	pid := strings.TrimSpace(r.Stdout.String())
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		out := c.run(fmt.Sprintf("check%d", i), "cat /proc/"+pid+"/stat 2>/dev/null || echo gone").Stdout.String()
		if strings.TrimSpace(out) == "gone" {
			break
		}
		require.True(t, time.Now().Before(deadline), "orphan %s not reaped: %s", pid, out)
		time.Sleep(50 * time.Millisecond)
	}
}

// sleepersWithArg lists host pids running `sleep <arg>`.
func sleepersWithArg(t *testing.T, arg string) []string {
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var pids []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(cmdline) == "sleep\x00"+arg+"\x00" {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

func TestStopLeavesNothingBehind(t *testing.T) {
	fdsBefore := countFDs(t)
	g, c := startSandbox(t)
	const marker = "31337"
	require.NoError(t, c.call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: "a", Command: "sleep", Args: []string{marker}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}}))
	// A daemon that left the process group survives kill(-pgid) but not the
	// end of the PID namespace.
	require.NoError(t, c.call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: "b", Command: "setsid", Args: []string{"sleep", marker}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}}))
	c.WaitExit("b")
	require.Len(t, sleepersWithArg(t, marker), 2)

	require.NoError(t, g.Stop(context.Background()))
	<-g.Done()
	require.NoError(t, g.Err())
	require.NoError(t, g.Stop(context.Background()), "Stop twice")
	require.Empty(t, sleepersWithArg(t, marker))
	require.LessOrEqual(t, countFDs(t), fdsBefore, "descriptors leaked")
}

func TestShutdownRequestThenStop(t *testing.T) {
	g, c := startSandbox(t)
	require.NoError(t, c.call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: "a", Command: "sleep", Args: []string{"60"}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}}))
	require.NoError(t, c.call(protocol.AgentMethodShutdown, protocol.ShutdownParams{GraceMillis: 1000}))
	require.Equal(t, "SIGTERM", c.WaitExit("a").Exit.Signal)
	select {
	case <-g.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not exit after shutdown")
	}
	require.NoError(t, g.Err(), "a shutdown is a clean end")
	require.NoError(t, g.Stop(context.Background()))
}

func TestShareRejectsUncleanPaths(t *testing.T) {
	g := &guest{}
	_, err := g.Share("relative", false)
	require.Error(t, err)
	_, err = g.Share("/a/../b", false)
	require.Error(t, err)
	src, err := g.Share("/srv/data", true)
	require.NoError(t, err)
	require.Equal(t, protocol.MountSource{Kind: "bind", Path: "/srv/data"}, src)
}

func countFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(entries)
}

// testLastWordsEnv makes the re-executed test binary an agent that writes
// lastWords on its connection (fd 3) and exits at once.
const testLastWordsEnv = "COWORK_VMM_PROCESS_TEST_LAST_WORDS"

var lastWords = []byte(`{"kind":"reply","id":7}`)

func writeLastWords() int {
	conn := os.NewFile(3, "agent-conn")
	if err := protocol.WriteFrame(conn, lastWords); err != nil {
		return 1
	}
	return 0
}

// TestAgentsLastFramesAreReadable: what the agent wrote just before it
// exited (its reply to the shutdown request) can still be read after the
// guest is Done; the backend used to close the connection as soon as the
// agent was reaped, and the reader lost it.
func TestAgentsLastFramesAreReadable(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	b := New(Options{Executable: exe, Env: []string{testLastWordsEnv + "=1"}})
	g, err := b.Start(context.Background(), helper.GuestConfig{})
	if err != nil && (errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC)) {
		t.Skipf("user namespaces unavailable here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Stop(context.Background()) })
	conn, err := g.Agent(context.Background())
	require.NoError(t, err)
	select {
	case <-g.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not exit")
	}
	require.NoError(t, g.Err())
	body, err := protocol.ReadFrame(conn)
	require.NoError(t, err, "reading what the agent wrote before it exited")
	require.Equal(t, lastWords, body)
	_, err = protocol.ReadFrame(conn)
	require.ErrorIs(t, err, io.EOF, "then the end of the connection")
}
