package agent

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/timerslack"
)

func requireTimerSlackFiles(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/proc/self/timerslack_ns"); err != nil {
		t.Skipf("this kernel's /proc has no timerslack_ns (Linux 4.6): %v", err)
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
	require.NoError(t, unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(timerslack.GuestTick.Nanoseconds()), 0, 0, 0))
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(own), 0, 0, 0)

	out := runForSlack(t)
	assert.Equal(t, strconv.FormatInt(timerslack.Default.Nanoseconds(), 10), out)
	after, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, timerslack.GuestTick.Nanoseconds(), int64(after))
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
