package egress

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

type loopbackResolver struct{}

func (loopbackResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host == "echo.test" {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func echoServer(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// exchange runs one request through HandleConn over net.Pipe and returns the
// reply and the guest end.
func exchange(t *testing.T, s *Server, req protocol.EgressRequest) (protocol.EgressReply, net.Conn) {
	t.Helper()
	guest, host := net.Pipe()
	go s.HandleConn(context.Background(), host)
	go protocol.WriteEgressRequest(guest, req)
	rep, err := protocol.ReadEgressReply(guest)
	require.NoError(t, err)
	return rep, guest
}

func TestServerDecisions(t *testing.T) {
	port := echoServer(t)
	reg := NewRegistry()
	token, _ := reg.Register("s", []string{"echo.test"})
	openToken, _ := reg.Register("open", nil)
	loopbackOK := NewServer(Config{Lookup: reg.Lookup, Resolver: loopbackResolver{}, AllowAddr: func(a netip.Addr) bool { return a.IsLoopback() }})
	defer loopbackOK.Close()
	strict := NewServer(Config{Lookup: reg.Lookup, Resolver: loopbackResolver{}})
	defer strict.Close()

	rep, guest := exchange(t, loopbackOK, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "ECHO.test.", Port: port})
	require.True(t, rep.OK, rep.Error)
	_, err := guest.Write([]byte("hi"))
	require.NoError(t, err)
	buf := make([]byte, 2)
	_, err = io.ReadFull(guest, buf)
	require.NoError(t, err)
	require.Equal(t, "hi", string(buf))
	guest.Close()

	rep, guest = exchange(t, loopbackOK, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "other.test", Port: port})
	require.True(t, rep.Blocked)
	require.Equal(t, "blocked-by-allowlist: other.test", rep.Error)
	guest.Close()

	rep, guest = exchange(t, loopbackOK, protocol.EgressRequest{SpawnID: "s", Token: "wrong", Host: "echo.test", Port: port})
	require.False(t, rep.OK || rep.Blocked)
	guest.Close()

	reg.Unregister("s")
	rep, guest = exchange(t, loopbackOK, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "echo.test", Port: port})
	require.False(t, rep.OK)
	require.Contains(t, rep.Error, "no egress registered")
	guest.Close()

	// Unrestricted spawn, default address filter: the host's loopback is
	// never reachable, by name or literal.
	for _, host := range []string{"echo.test", "127.0.0.1", "::1", "169.254.169.254"} {
		rep, guest = exchange(t, strict, protocol.EgressRequest{SpawnID: "open", Token: openToken, Host: host, Port: port})
		require.False(t, rep.OK, host)
		require.False(t, rep.Blocked, host)
		guest.Close()
	}
}

func TestServerRefusesBadFrames(t *testing.T) {
	s := NewServer(Config{})
	defer s.Close()
	guest, host := net.Pipe()
	go s.HandleConn(context.Background(), host)
	go guest.Write([]byte{0, 1, 0, 0}) // declares 64 KiB
	rep, err := protocol.ReadEgressReply(guest)
	require.NoError(t, err)
	require.Contains(t, rep.Error, "limit")
	_, err = guest.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the connection is closed after a bad frame")
}

func TestServerConnectionLimitAndClose(t *testing.T) {
	port := echoServer(t)
	reg := NewRegistry()
	token, _ := reg.Register("s", nil)
	s := NewServer(Config{Lookup: reg.Lookup, Resolver: loopbackResolver{}, AllowAddr: func(a netip.Addr) bool { return a.IsLoopback() }, MaxConns: 1})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background(), l) }()

	dial := func() (protocol.EgressReply, net.Conn) {
		c, err := net.Dial("tcp", l.Addr().String())
		require.NoError(t, err)
		require.NoError(t, protocol.WriteEgressRequest(c, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "echo.test", Port: port}))
		rep, err := protocol.ReadEgressReply(c)
		require.NoError(t, err)
		return rep, c
	}
	first, c1 := dial()
	require.True(t, first.OK)
	second, c2 := dial()
	require.False(t, second.OK)
	require.Contains(t, second.Error, "1 connections")
	c2.Close()

	require.NoError(t, s.Close())
	require.NoError(t, <-served)
	_, err = io.ReadAll(c1)
	require.NoError(t, err, "Close ends spliced connections (EOF)")
	c1.Close()
}

// TestServerPolicyPort: the server asks the policy about the requested
// port, so a "host:port" entry opens that port only.
func TestServerPolicyPort(t *testing.T) {
	port := echoServer(t)
	reg := NewRegistry()
	token, _ := reg.Register("s", []string{"echo.test:" + strconv.Itoa(port)})
	s := NewServer(Config{Lookup: reg.Lookup, Resolver: loopbackResolver{}, AllowAddr: func(a netip.Addr) bool { return a.IsLoopback() }})
	defer s.Close()
	rep, guest := exchange(t, s, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "echo.test", Port: port})
	guest.Close()
	require.True(t, rep.OK, rep.Error)
	rep, guest = exchange(t, s, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "echo.test", Port: port + 1})
	guest.Close()
	require.True(t, rep.Blocked, "another port of the same host")
}

func TestServerLogsGuestRefusalsRateLimited(t *testing.T) {
	logs := &ratelogtest.LogBuffer{}
	s := NewServer(Config{Logger: logs.Logger()})
	defer s.Close()
	for i := range 3 * ratelog.DefaultBurst {
		rep, guest := exchange(t, s, protocol.EgressRequest{SpawnID: "nobody", Token: "t", Host: "example.com", Port: 443})
		guest.Close()
		require.False(t, rep.OK, "request %d", i)
	}
	lines := logs.Lines("egress refused: unknown spawn or wrong token")
	require.Len(t, lines, ratelog.DefaultBurst, logs.String())
}
