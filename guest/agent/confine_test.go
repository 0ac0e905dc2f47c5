package agent

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/sandboxprobe"
)

// testProbeEnv makes the test binary run sandboxprobe (see TestMain).
const testProbeEnv = "COWORK_VMM_AGENT_TEST_PROBE"

// probeAsSpawn spawns this test binary as sandboxprobe through the agent
// and returns what it found.
func probeAsSpawn(t *testing.T, c *testClient) map[string]string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "probe", Command: exe, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin", testProbeEnv + "=1"},
	}, nil))
	p := c.WaitExit("probe")
	require.Equal(t, 0, *p.Exit.ExitCode, p.Stderr.String())
	return sandboxprobe.Parse(p.Stdout.String())
}

// TestSpawnRunsUnderTheFilter: a spawn finds the keyrings and TIOCSTI
// refused (the wiring; guest/seccomp tests the filter).
func TestSpawnRunsUnderTheFilter(t *testing.T) {
	c := startAgent(t, Options{})
	got := probeAsSpawn(t, c)
	eperm := unix.EPERM.Error()
	assert.Equal(t, eperm, got[sandboxprobe.SessionKeyring])
	assert.Equal(t, eperm, got[sandboxprobe.AddKey])
	assert.Equal(t, eperm, got[sandboxprobe.StdinInject], "TIOCSTI on its stdin")
	if got[sandboxprobe.TTYOpen] == sandboxprobe.OK {
		assert.Equal(t, eperm, got[sandboxprobe.TTYInject], "TIOCSTI on /dev/tty")
	}
}

// TestSpawnThreadHasItsOwnSessionKeyring: a process forked after
// joinFreshSessionKeyring has a new anonymous session keyring, not the
// one of the thread that forked it (the filter is left out here, so
// that the child can look).
func TestSpawnThreadHasItsOwnSessionKeyring(t *testing.T) {
	parent, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	if err == unix.ENOSYS {
		t.Skip("this kernel has no keyrings")
	}
	require.NoError(t, err)
	exe, err := os.Executable()
	require.NoError(t, err)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	var pid int
	require.NoError(t, onOwnThread(func() error {
		if err := joinFreshSessionKeyring(); err != nil {
			return err
		}
		pid, err = forkExec(exe, []string{exe}, &syscall.ProcAttr{
			Env: []string{testProbeEnv + "=1"}, Files: []uintptr{0, w.Fd(), 2},
		})
		return err
	}))
	w.Close()
	var status syscall.WaitStatus
	_, err = syscall.Wait4(pid, &status, 0, nil)
	require.NoError(t, err)
	out := make([]byte, 4096)
	n, _ := r.Read(out)
	got := sandboxprobe.Parse(string(out[:n]))
	child, err := strconv.Atoi(got[sandboxprobe.SessionKeyring])
	require.NoError(t, err, "%s", out[:n])
	assert.NotEqual(t, parent, child, "the child's session keyring is the parent's")
	assert.Equal(t, "_ses", got[sandboxprobe.KeyringName], "an anonymous session keyring")
	assert.Equal(t, sandboxprobe.OK, got[sandboxprobe.AddKey], "it is the child's own to use")
	after, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	require.NoError(t, err)
	assert.Equal(t, parent, after, "the test's own threads keep theirs")
	assert.False(t, strings.Contains(got[sandboxprobe.KeyringName], "cowork"), got[sandboxprobe.KeyringName])
}

// TestChildAgentIsolatedSpawnsAreFiltered runs the agent as the VM does
// (real root, --isolate-sessions): an isolated spawn and the command its
// sudo starts both run under the filter (seccomp mode 2, no_new_privs),
// and sudo still works.
func TestChildAgentIsolatedSpawnsAreFiltered(t *testing.T) {
	c := startChildAgent(t, []string{"--isolate-sessions"})
	c.setupHostSystem()
	home := t.TempDir()
	c.bind(home, "/sessions/a", false)
	require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "look", Session: "a", UID: sessionUIDOf("a"), Command: "/bin/sh", Cwd: "/sessions/a",
		Args: []string{"-c", `grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; sudo grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; sudo id -u`},
		Env:  []string{"PATH=/usr/bin:/bin", testGuestRequestEnv + "=1"},
	}, nil))
	p := c.WaitExit("look")
	require.Equal(t, 0, *p.Exit.ExitCode, p.Stderr.String())
	assert.Equal(t, "NoNewPrivs:\t1\nSeccomp:\t2\nNoNewPrivs:\t1\nSeccomp:\t2\n0\n", p.Stdout.String(), p.Stderr.String())
}
