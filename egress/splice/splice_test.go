package splice

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err = net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	server = <-accepted
	require.NotNil(t, server)
	return client, server
}

// TestPairHalfClose: a request, a half-close, and the answer still arrives.
func TestPairHalfClose(t *testing.T) {
	c1, s1 := tcpPair(t) // client side
	c2, s2 := tcpPair(t) // upstream side
	done := make(chan struct{})
	go func() { Pair(s1, nil, c2, time.Minute); close(done) }()

	_, err := c1.Write([]byte("ping"))
	require.NoError(t, err)
	require.NoError(t, c1.(*net.TCPConn).CloseWrite())
	got, err := io.ReadAll(s2)
	require.NoError(t, err)
	require.Equal(t, "ping", string(got))
	_, err = s2.Write([]byte("pong"))
	require.NoError(t, err)
	s2.Close()
	got, err = io.ReadAll(c1)
	require.NoError(t, err)
	require.Equal(t, "pong", string(got))
	<-done
	c1.Close()
}

// TestPairIdleCloses: nothing moves, so both ends are closed (the test waits
// for the EOF, it does not time it).
func TestPairIdleCloses(t *testing.T) {
	c1, s1 := tcpPair(t)
	c2, s2 := tcpPair(t)
	defer c1.Close()
	defer s2.Close()
	done := make(chan struct{})
	go func() { Pair(s1, nil, c2, 20*time.Millisecond); close(done) }()
	_, err := io.ReadAll(c1)
	require.NoError(t, err)
	<-done
}
