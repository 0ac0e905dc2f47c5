package process

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/sandboxprobe"
)

// testProbeEnv makes the test binary run sandboxprobe (see TestMain);
// testInnerEnv makes it the helper side of TestSpawnCannotReachTheUsersTerminal,
// started on a terminal of the test's.
const (
	testProbeEnv = "COWORK_VMM_PROCESS_TEST_PROBE"
	testInnerEnv = "COWORK_VMM_PROCESS_TEST_ON_A_TERMINAL"
	// loginKeyring names the session keyring the helper side joins, as a
	// login (pam_keyinit) gives one.
	loginKeyring = "cowork-test-login"
)

// openPTY opens a pseudo-terminal pair.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	master = os.NewFile(uintptr(m), "ptmx")
	t.Cleanup(func() { master.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetUint32(m, unix.TIOCGPTN)
	require.NoError(t, err)
	s, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	slave = os.NewFile(uintptr(s), "pts")
	t.Cleanup(func() { slave.Close() })
	return master, slave
}

// TestSpawnCannotReachTheUsersTerminal is issue #39's attack: the helper
// runs on the user's terminal (here a pseudo-terminal the test holds, made
// the helper side's controlling terminal), and a spawn tries to open
// /dev/tty and queue a command in the terminal's input with TIOCSTI, and
// to read the helper's session keyring. Nothing may arrive on the
// terminal, and the keyring stays out of reach.
func TestSpawnCannotReachTheUsersTerminal(t *testing.T) {
	if os.Getenv(testInnerEnv) == "1" {
		probeFromTheTerminal(t)
		return
	}
	_, slave := openPTY(t)
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^TestSpawnCannotReachTheUsersTerminal$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), testInnerEnv+"=1")
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	keyrings := kernelHasKeyrings()
	if keyrings {
		require.NoError(t, startInLoginKeyring(cmd))
	} else {
		t.Log("this kernel has no keyrings (no CONFIG_KEYS): only the terminal is tried")
		require.NoError(t, cmd.Start())
	}
	require.NoError(t, cmd.Wait(), "%s", out.String())
	if strings.Contains(out.String(), "--- SKIP") {
		t.Skipf("the helper side skipped: %s", out.String())
	}
	got := map[string]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		if rest, ok := strings.CutPrefix(l, "PROBE "); ok {
			name, value, _ := strings.Cut(rest, ": ")
			got[name] = value
		}
	}
	require.NotEmpty(t, got, "%s", out.String())
	t.Logf("the spawn found: %v", got)

	// Nothing was queued for the terminal's reader (the user's shell).
	require.NoError(t, unix.SetNonblock(int(slave.Fd()), true))
	buf := make([]byte, 256)
	n, err := unix.Read(int(slave.Fd()), buf)
	assert.True(t, errors.Is(err, unix.EAGAIN), "the terminal has input waiting: %q (%v)", buf[:max(n, 0)], err)

	assert.Contains(t, []string{unix.ENXIO.Error(), unix.ENOENT.Error()}, got[sandboxprobe.TTYOpen], "opening /dev/tty")
	assert.Equal(t, unix.EPERM.Error(), got[sandboxprobe.StdinInject], "TIOCSTI on its stdin")
	if v, ok := got[sandboxprobe.TTYInject]; ok {
		assert.Equal(t, unix.EPERM.Error(), v, "TIOCSTI on /dev/tty")
	}
	if keyrings {
		assertKeyringsOutOfReach(t, got)
	}
}

// assertKeyringsOutOfReach checks the probe's keyring findings: the spawn
// neither reaches the helper's session keyring nor the user's keys.
func assertKeyringsOutOfReach(t *testing.T, got map[string]string) {
	helperKeyring := got["helper-session-keyring"]
	require.NotEmpty(t, helperKeyring)
	assert.NotEqual(t, helperKeyring, got[sandboxprobe.SessionKeyring], "the spawn reaches the helper's session keyring")
	assert.NotEqual(t, loginKeyring, got[sandboxprobe.KeyringName])
	assert.Equal(t, sandboxprobe.None, got[sandboxprobe.ProcKeys], "/proc/keys names the user's keys")
	assert.NotEqual(t, sandboxprobe.OK, got[sandboxprobe.ProcKeysUnmask], "the cover over /proc/keys came off")
	assert.Equal(t, unix.EPERM.Error(), got[sandboxprobe.SessionKeyring])
	assert.Equal(t, unix.EPERM.Error(), got[sandboxprobe.AddKey])
}

// kernelHasKeyrings reports whether this kernel has keyrings: keyctl is
// ENOSYS without CONFIG_KEYS.
func kernelHasKeyrings() bool {
	_, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	return !errors.Is(err, unix.ENOSYS)
}

// startInLoginKeyring starts cmd from a thread that joined a session
// keyring named loginKeyring (as pam_keyinit gives a login), and that then
// ends: keyrings are a thread's, and a process inherits its forking
// thread's.
func startInLoginKeyring(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		if _, err := unix.KeyctlJoinSessionKeyring(loginKeyring); err != nil {
			done <- fmt.Errorf("joining a session keyring: %w", err)
			return
		}
		done <- cmd.Start()
	}()
	return <-done
}

// probeFromTheTerminal is the helper side: on the terminal, in the login
// keyring, it starts the sandbox and runs the probe as a spawn,
// printing what it found as "PROBE name: value" lines.
func probeFromTheTerminal(t *testing.T) {
	tty, err := unix.Open("/dev/tty", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	require.NoError(t, err, "the helper side has a controlling terminal")
	unix.Close(tty)
	if kernelHasKeyrings() {
		id, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
		require.NoError(t, err, "the helper side's session keyring")
		fmt.Printf("PROBE helper-session-keyring: %d\n", id)
	}

	g, c := startSandbox(t)
	exe, err := os.Executable()
	require.NoError(t, err)
	src, err := g.Share(filepath.Dir(exe), true)
	require.NoError(t, err)
	require.NoError(t, c.call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{Source: src, Target: "/sessions/probe", ReadOnly: true}}))
	require.NoError(t, c.call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "probe", Command: "/sessions/probe/" + filepath.Base(exe), Cwd: "/",
		Env: []string{"PATH=/usr/bin:/bin", testProbeEnv + "=1"},
	}))
	r := c.WaitExit("probe")
	require.Equal(t, 0, *r.Exit.ExitCode, r.Stderr.String())
	for name, value := range sandboxprobe.Parse(r.Stdout.String()) {
		fmt.Printf("PROBE %s: %s\n", name, value)
	}
}
