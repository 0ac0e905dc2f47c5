package agent

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// slackOf reads a thread's timer slack.
func slackOf(t *testing.T, tid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", tid))
	require.NoError(t, err)
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	require.NoError(t, err)
	return v
}

func requireTimerSlackFiles(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/proc/self/timerslack_ns"); err != nil {
		t.Skipf("this kernel's /proc has no timerslack_ns (Linux 4.6): %v", err)
	}
}

// TestSlowAgentTimers runs on this test binary's own threads: each gets
// agentTimerSlack.
func TestSlowAgentTimers(t *testing.T) {
	requireTimerSlackFiles(t)
	if os.Geteuid() != 0 {
		t.Skip("setting another thread's timer slack needs CAP_SYS_NICE (run as root)")
	}
	t.Cleanup(func() { // every thread back to its default
		tids, _ := threadIDs()
		for _, tid := range tids {
			_ = os.WriteFile(fmt.Sprintf("/proc/%d/timerslack_ns", tid), []byte("0"), 0)
		}
	})
	require.NoError(t, slowAgentTimers())
	tids, err := threadIDs()
	require.NoError(t, err)
	require.NotEmpty(t, tids)
	for _, tid := range tids {
		assert.Equal(t, agentTimerSlack.Nanoseconds(), slackOf(t, tid), "thread %d", tid)
	}
}

// TestForkExecDefaultSlack: a process started from a thread with the
// agent's slack gets the kernel's default, and the thread keeps its own.
func TestForkExecDefaultSlack(t *testing.T) {
	requireTimerSlackFiles(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(agentTimerSlack.Nanoseconds()), 0, 0, 0))
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(own), 0, 0, 0)

	out := runForSlack(t)
	assert.Equal(t, strconv.FormatInt(defaultTimerSlack.Nanoseconds(), 10), out)
	after, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, agentTimerSlack.Nanoseconds(), int64(after))
}

// runForSlack starts /bin/sh through forkExec to print its own timer slack
// and returns what it printed.
func runForSlack(t *testing.T) string {
	t.Helper()
	sh, err := os.Stat("/bin/sh")
	if err != nil || !sh.Mode().IsRegular() && sh.Mode()&os.ModeSymlink == 0 {
		t.Skip("no /bin/sh")
	}
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	pid, err := forkExec("/bin/sh", []string{"sh", "-c", "cat /proc/self/timerslack_ns"},
		&syscall.ProcAttr{Env: []string{"PATH=/usr/bin:/bin"}, Files: []uintptr{0, w.Fd(), 2}})
	w.Close()
	require.NoError(t, err)
	var status syscall.WaitStatus
	_, err = syscall.Wait4(pid, &status, 0, nil)
	require.NoError(t, err)
	b := make([]byte, 64)
	n, _ := r.Read(b)
	require.True(t, status.Exited() && status.ExitStatus() == 0, "sh: %v", status)
	return strings.TrimSpace(string(b[:n]))
}
