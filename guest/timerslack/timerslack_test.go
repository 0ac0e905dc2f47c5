package timerslack

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
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

// TestRaise runs on this test binary's own threads: each gets the slack.
func TestRaise(t *testing.T) {
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
	require.NoError(t, Raise(GuestTick))
	tids, err := threadIDs()
	require.NoError(t, err)
	require.NotEmpty(t, tids)
	for _, tid := range tids {
		assert.Equal(t, GuestTick.Nanoseconds(), slackOf(t, tid), "thread %d", tid)
	}
}

// TestWithDefault: a process started from a thread with a raised slack
// gets the kernel's default, and the thread keeps its own.
func TestWithDefault(t *testing.T) {
	requireTimerSlackFiles(t)
	if _, err := exec.LookPath("cat"); err != nil {
		t.Skip("no cat")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(GuestTick.Nanoseconds()), 0, 0, 0))
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(own), 0, 0, 0)

	var out []byte
	require.NoError(t, WithDefault(func() error {
		out, err = exec.Command("cat", "/proc/self/timerslack_ns").Output()
		return err
	}))
	assert.Equal(t, strconv.FormatInt(Default.Nanoseconds(), 10), strings.TrimSpace(string(out)))
	after, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, GuestTick.Nanoseconds(), int64(after))
}
