package egress

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// testNetns is a network namespace of the test's own: one OS thread locked
// into it runs the functions given to do (and the commands they start,
// which inherit the thread's namespace). Nothing in it is connected to the
// host's network; it vanishes with its thread when the test ends.
type testNetns struct{ calls chan func() }

func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating a network namespace needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	n := &testNetns{calls: make(chan func())}
	ready := make(chan error)
	go func() {
		// Never unlocked: the thread exits with this goroutine, so no
		// other goroutine ever runs in the test's namespace.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for f := range n.calls {
			f()
		}
	}()
	if err := <-ready; err != nil {
		t.Skipf("cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() { close(n.calls) })
	// The interfaces the commands see must be the new namespace's (only
	// lo) before any command changes anything.
	out := n.ip(t, "-o", "link", "show")
	require.Equal(t, 1, strings.Count(out, "\n"), "the test namespace has only lo:\n%s", out)
	require.Contains(t, out, ": lo:")
	return n
}

func (n *testNetns) do(f func()) {
	done := make(chan struct{})
	n.calls <- func() { defer close(done); f() }
	<-done
}

// ip runs ip(8) inside the namespace and returns its output.
func (n *testNetns) ip(t *testing.T, args ...string) string {
	t.Helper()
	var out []byte
	var err error
	n.do(func() { out, err = exec.Command("ip", args...).CombinedOutput() })
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// TestAddrFilterNetns: the real address reader, run in a namespace the test
// made with a veth pair, sees addresses added and removed while the server
// runs; the server refuses each of them (IPv4, IPv6, IPv4-mapped, private
// with AllowPrivate on) from the first dial after it was added, and dials
// it again once it is gone. The recording dialer sends nothing.
func TestAddrFilterNetns(t *testing.T) {
	n := newTestNetns(t)
	n.ip(t, "link", "add", "cwk0", "type", "veth", "peer", "name", "cwk1")
	n.ip(t, "link", "set", "cwk0", "up")
	n.ip(t, "link", "set", "cwk1", "up")
	read := func() (addrs []netip.Addr, err error) {
		n.do(func() { addrs, err = hostInterfaceAddrs() })
		return addrs, err
	}
	d := &recordingDialer{succeed: true}
	defer d.close()
	s := NewServer(Config{Dialer: d, AllowPrivate: true, HostAddrs: read})
	defer s.Close()
	dial := func(addr string) error {
		conn, err := s.DialContext(context.Background(), "tcp", net.JoinHostPort(addr, "80"))
		if err == nil {
			conn.Close()
		}
		return err
	}

	require.NoError(t, dial("198.51.100.7"), "not the host's yet")
	n.ip(t, "addr", "add", "198.51.100.7/24", "dev", "cwk0")
	n.ip(t, "addr", "add", "10.9.8.7/24", "dev", "cwk1")
	n.ip(t, "addr", "add", "2001:db8::7/64", "dev", "cwk0", "nodad")
	for _, a := range []string{"198.51.100.7", "::ffff:198.51.100.7", "10.9.8.7", "::ffff:10.9.8.7", "2001:db8::7"} {
		err := dial(a)
		require.True(t, isAddrRefused(err), "%s: %v", a, err)
		require.Contains(t, err.Error(), "an address of the host itself")
	}
	require.NoError(t, dial("10.9.8.8"), "a private address that is not the host's, with AllowPrivate")

	n.ip(t, "addr", "del", "198.51.100.7/24", "dev", "cwk0")
	require.NoError(t, dial("198.51.100.7"), "a removed address is dialled again")
	require.Equal(t, []string{"198.51.100.7:80", "10.9.8.8:80", "198.51.100.7:80"}, d.addresses())
}
