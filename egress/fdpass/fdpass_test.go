package fdpass

import (
	"context"
	"io"
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// controlPair returns both ends of a SOCK_SEQPACKET control socket.
func controlPair(t *testing.T) (agent, helper *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	wrap := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "control")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		return c.(*net.UnixConn)
	}
	return wrap(fds[0]), wrap(fds[1])
}

func TestRoundTrip(t *testing.T) {
	agentEnd, helperEnd := controlPair(t)
	d := &Dialer{Conn: agentEnd}
	l := NewListener(helperEnd)
	defer l.Close()
	defer agentEnd.Close()

	for i := range 3 {
		guest, err := d.DialHost(context.Background())
		require.NoError(t, err)
		host, err := l.Accept()
		require.NoError(t, err)

		msg := []byte{'a' + byte(i), 'b'}
		_, err = guest.Write(msg)
		require.NoError(t, err)
		got := make([]byte, 2)
		_, err = io.ReadFull(host, got)
		require.NoError(t, err)
		require.Equal(t, msg, got)

		_, err = host.Write([]byte("reply"))
		require.NoError(t, err)
		host.Close()
		back, err := io.ReadAll(guest)
		require.NoError(t, err)
		require.Equal(t, "reply", string(back))
		guest.Close()
	}
}

// TestBadDescriptorsAreSkipped: a pipe, a listening socket and a datagram
// socket are dropped; the next good connection is still accepted.
func TestBadDescriptorsAreSkipped(t *testing.T) {
	agentEnd, helperEnd := controlPair(t)
	l := NewListener(helperEnd)
	defer l.Close()
	defer agentEnd.Close()

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	dgram, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	require.NoError(t, err)
	defer unix.Close(dgram)
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@fdpass-test-listener", Net: "unix"})
	require.NoError(t, err)
	defer ul.Close()
	lf, err := ul.File()
	require.NoError(t, err)
	defer lf.Close()

	for _, fd := range []int{int(r.Fd()), dgram, int(lf.Fd())} {
		_, _, err := agentEnd.WriteMsgUnix([]byte{0}, unix.UnixRights(fd), nil)
		require.NoError(t, err)
	}
	d := &Dialer{Conn: agentEnd}
	guest, err := d.DialHost(context.Background())
	require.NoError(t, err)
	defer guest.Close()
	host, err := l.Accept()
	require.NoError(t, err)
	defer host.Close()
	_, err = guest.Write([]byte("x"))
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = io.ReadFull(host, b)
	require.NoError(t, err)
}

func TestAcceptEndsWhenAgentCloses(t *testing.T) {
	agentEnd, helperEnd := controlPair(t)
	l := NewListener(helperEnd)
	defer l.Close()
	agentEnd.Close()
	_, err := l.Accept()
	require.Error(t, err)
}
