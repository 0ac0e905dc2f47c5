package netns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// childEnv makes the test binary act as the spawned process: it dials each
// address in os.Args and prints "ok" or the error per address.
const childEnv = "NETNS_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		for _, addr := range os.Args[1:] {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				fmt.Println("fail", err)
				continue
			}
			c.Close()
			fmt.Println("ok")
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func newOrSkip(t *testing.T) *Namespace {
	t.Helper()
	ns, err := New()
	if errors.Is(err, syscall.EPERM) {
		t.Skipf("creating a network namespace is not permitted here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	return ns
}

// TestChildReachesOnlyTheNamespace: a process forked inside the namespace
// reaches a listener made inside it (the proxy's place) and not a listener
// on the original namespace's loopback.
func TestChildReachesOnlyTheNamespace(t *testing.T) {
	ns := newOrSkip(t)

	outside, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer outside.Close()
	inside, err := ns.Listen("127.0.0.1:0")
	require.NoError(t, err)
	defer inside.Close()
	go func() {
		for {
			c, err := inside.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

	exe, err := os.Executable()
	require.NoError(t, err)
	var out strings.Builder
	cmd := exec.Command(exe, outside.Addr().String(), inside.Addr().String())
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stdout = &out
	cmd.Stderr = &out
	require.NoError(t, ns.Do(cmd.Start))
	require.NoError(t, cmd.Wait())

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2, out.String())
	require.True(t, strings.HasPrefix(lines[0], "fail"), "the original loopback must be unreachable: %s", lines[0])
	require.Equal(t, "ok", lines[1], "the namespace's own listener must be reachable")

	// And from here, the namespace's listener is not reachable at its
	// address: the two loopbacks are distinct.
	c, err := net.Dial("tcp", inside.Addr().String())
	if err == nil {
		c.Close()
		t.Fatalf("the namespace's listener %s answered from outside the namespace", inside.Addr())
	}
}

func TestDoAfterClose(t *testing.T) {
	ns := newOrSkip(t)
	require.NoError(t, ns.Close())
	require.ErrorIs(t, ns.Do(func() error { return nil }), ErrClosed)
	require.NoError(t, ns.Close(), "Close is idempotent")
}
