package seccomp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// childModeEnv makes the re-executed test binary a child under the
// filter: "install" installs it on a locked thread, probes, and starts
// itself again from that thread as "inherited", which only probes.
const childModeEnv = "COWORK_VMM_SECCOMP_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childModeEnv) {
	case "install":
		os.Exit(installChild())
	case "inherited":
		probe(os.Stdout)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// installChild installs the filter on its locked thread, probes there,
// then forks and execs itself from that thread.
func installChild() int {
	runtime.LockOSThread()
	prog, err := Program()
	if err == nil {
		err = Install(prog)
	}
	if err != nil {
		fmt.Println("install:", err)
		return 1
	}
	fmt.Println("-- installed")
	probe(os.Stdout)
	exe, _ := os.Executable()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childModeEnv+"=inherited")
	out, err := cmd.Output()
	if err != nil {
		fmt.Println("inherited:", err)
		return 1
	}
	fmt.Print("-- inherited\n", string(out))
	return 0
}

// probe makes the calls the test looks at, one "name: errno" line each
// ("ok" for success).
func probe(w *os.File) {
	report := func(name string, errno syscall.Errno) {
		res := "ok"
		if errno != 0 {
			res = errno.Error()
		}
		fmt.Fprintf(w, "%s: %s\n", name, res)
	}
	_, _, e := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd), 0) // KEY_SPEC_SESSION_KEYRING
	report("keyctl", e)
	desc := []byte("cowork-test\x00")
	kind := []byte("user\x00")
	_, _, e = unix.Syscall6(unix.SYS_ADD_KEY, uintptr(unsafePtr(kind)), uintptr(unsafePtr(desc)), 0, 0, uintptr(0xfffffffd), 0)
	report("add_key", e)
	_, _, e = unix.Syscall(unix.SYS_REQUEST_KEY, uintptr(unsafePtr(kind)), uintptr(unsafePtr(desc)), 0)
	report("request_key", e)
	null, err := unix.Open("/dev/null", unix.O_RDWR, 0)
	if err != nil {
		fmt.Fprintln(w, "open: ", err)
		return
	}
	report("open", 0)
	c := byte('x')
	_, _, e = unix.Syscall(unix.SYS_IOCTL, uintptr(null), unix.TIOCSTI, uintptr(unsafePtr([]byte{c})))
	report("TIOCSTI", e)
	_, _, e = unix.Syscall(unix.SYS_IOCTL, uintptr(null), unix.TCGETS, uintptr(unsafePtr(make([]byte, 64))))
	report("TCGETS", e)
	_, _, e = unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	report("personality-query", e)
	_, _, e = unix.Syscall(unix.SYS_PERSONALITY, 0x0400000, 0, 0)
	report("personality-rie", e)
	report("getpid", errnoOf(unix.Getpid() > 0))
}

func errnoOf(ok bool) syscall.Errno {
	if ok {
		return 0
	}
	return unix.EINVAL
}

// TestInstalledFilter runs a child under the filter: the refused calls
// fail with EPERM on the thread that installed it and in a process forked
// from that thread, and ordinary calls still work.
func TestInstalledFilter(t *testing.T) {
	if err := Supported(); err != nil {
		t.Skipf("this kernel cannot install the filter: %v", err)
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childModeEnv+"=install")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	parts := strings.Split(string(out), "-- inherited\n")
	require.Len(t, parts, 2, "%s", out)
	eperm := unix.EPERM.Error()
	for i, part := range parts {
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(part), "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok {
				got[k] = v
			}
		}
		where := []string{"installing thread", "forked child"}[i]
		for _, refused := range []string{"keyctl", "add_key", "request_key", "TIOCSTI", "personality-rie"} {
			assert.Equal(t, eperm, got[refused], "%s: %s", where, refused)
		}
		assert.Equal(t, "ok", got["open"], where)
		assert.Equal(t, "ok", got["getpid"], where)
		assert.Equal(t, "ok", got["personality-query"], where)
		assert.Equal(t, unix.ENOTTY.Error(), got["TCGETS"], "%s: other ioctls reach the driver", where)
	}
}

// TestUnfilteredProbe is the control: without the filter the same probes
// do not fail with EPERM (the keyring calls reach the kernel's keyrings,
// TIOCSTI reaches /dev/null's driver), so the test above measures the
// filter.
func TestUnfilteredProbe(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childModeEnv+"=inherited")
	out, err := cmd.Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), "TIOCSTI: "+unix.ENOTTY.Error())
	if !errors.Is(keyringsAvailable(), unix.ENOSYS) {
		assert.NotContains(t, string(out), "keyctl: "+unix.EPERM.Error())
	}
}

func keyringsAvailable() error {
	_, _, e := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd), 0)
	if e != 0 {
		return e
	}
	return nil
}

func TestSupported(t *testing.T) {
	// This kernel (any Linux a helper runs on) has filter mode; the test
	// fails if the probe itself is wrong.
	require.NoError(t, Supported())
}
