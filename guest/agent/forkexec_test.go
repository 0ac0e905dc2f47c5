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

// TestForkExecDefaultSlack: the agent's forkExec starts a process with the
// kernel's default slack from a thread with a raised one (the wiring;
// package timerslack tests WithDefault itself).
func TestForkExecDefaultSlack(t *testing.T) {
	if _, err := os.Stat("/proc/self/timerslack_ns"); err != nil {
		t.Skipf("this kernel's /proc has no timerslack_ns (Linux 4.6): %v", err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(timerslack.GuestTick.Nanoseconds()), 0, 0, 0))
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(own), 0, 0, 0)
	assert.Equal(t, strconv.FormatInt(timerslack.Default.Nanoseconds(), 10), runForSlack(t))
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
