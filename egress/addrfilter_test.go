package egress

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// recordingDialer records every address the server dials and never opens a
// socket: a dial fails, or with succeed returns one end of a net.Pipe. It
// is how these tests prove which addresses would be dialled without sending
// a packet anywhere.
type recordingDialer struct {
	mu      sync.Mutex
	dialed  []string
	succeed bool
	peers   []net.Conn
}

func (d *recordingDialer) DialContext(_ context.Context, _, address string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dialed = append(d.dialed, address)
	if !d.succeed {
		return nil, errors.New("recordingDialer: not connecting")
	}
	ours, peer := net.Pipe()
	d.peers = append(d.peers, peer)
	return ours, nil
}

func (d *recordingDialer) addresses() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dialed...)
}

func (d *recordingDialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.peers {
		p.Close()
	}
}

// mapResolver answers each name with its addresses.
type mapResolver map[string][]string

func (r mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	list, ok := r[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	out := make([]netip.Addr, len(list))
	for i, s := range list {
		out[i] = netip.MustParseAddr(s)
	}
	return out, nil
}

// staticAddrs is a Config.HostAddrs that can change under a running server.
type staticAddrs struct {
	mu    sync.Mutex
	addrs []netip.Addr
	err   error
}

func (s *staticAddrs) read() ([]netip.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]netip.Addr(nil), s.addrs...), s.err
}

func hostAddrList(addrs ...string) *staticAddrs {
	s := &staticAddrs{}
	for _, a := range addrs {
		s.addrs = append(s.addrs, netip.MustParseAddr(a))
	}
	return s
}

// filterServer is a server with the default address filter, a recording
// dialer and the given host addresses.
func filterServer(t *testing.T, allowPrivate bool, own *staticAddrs, r Resolver) (*Server, *recordingDialer) {
	t.Helper()
	d := &recordingDialer{succeed: true}
	t.Cleanup(d.close)
	if r == nil {
		r = mapResolver{}
	}
	s := NewServer(Config{Resolver: r, Dialer: d, AllowPrivate: allowPrivate, HostAddrs: own.read})
	t.Cleanup(func() { s.Close() })
	return s, d
}

// alwaysRefused are refused whatever AllowPrivate says.
var alwaysRefused = []string{
	"0.0.0.0", "0.1.2.3", "0.255.255.255", "::ffff:0.0.0.0", "::ffff:0.1.2.3",
	"127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1",
	"169.254.169.254", "::ffff:169.254.169.254", "fe80::1",
	"224.0.0.1", "239.1.2.3", "ff02::1", "255.255.255.255", "::ffff:255.255.255.255",
	"::", "::127.0.0.1", "::10.0.0.1",
	"64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", // NAT64 of 127.0.0.1, 169.254.169.254
}

// privateAddrs are refused unless AllowPrivate.
var privateAddrs = []string{
	"10.0.0.1", "10.255.255.255", "172.16.0.1", "172.31.255.255", "192.168.0.1", "192.168.255.255",
	"100.64.0.1", "100.127.255.255", "fc00::1", "fd12:3456::1", "fec0::1",
	"::ffff:10.0.0.1", "::ffff:172.16.0.1", "::ffff:192.168.0.1", "::ffff:100.64.0.1",
	"64:ff9b::a00:1", // NAT64 of 10.0.0.1
}

// publicAddrs are never refused by the ranges (the edges of the private
// ranges included).
var publicAddrs = []string{
	"1.1.1.1", "9.255.255.255", "11.0.0.0", "172.15.255.255", "172.32.0.0", "192.167.255.255",
	"192.169.0.0", "100.63.255.255", "100.128.0.0", "203.0.113.5", "::ffff:203.0.113.5",
	"2001:db8::1", "2606:4700::1111", "fbff::1", "fe00::1", "64:ff9b::cb00:7105",
}

// TestAddrFilterRanges: every forbidden class is refused (IPv4-mapped and
// NAT64 forms too), the private ranges only while AllowPrivate is off, and
// the addresses around them are dialled.
func TestAddrFilterRanges(t *testing.T) {
	for _, allowPrivate := range []bool{false, true} {
		s, d := filterServer(t, allowPrivate, hostAddrList(), nil)
		for _, a := range alwaysRefused {
			_, err := s.DialContext(context.Background(), "tcp", net.JoinHostPort(a, "443"))
			var refused *AddrRefusedError
			require.ErrorAs(t, err, &refused, "%s (allowPrivate %v)", a, allowPrivate)
			require.True(t, strings.HasPrefix(err.Error(), guesthost.EgressBlockedByAddressFilter+": "), err.Error())
		}
		for _, a := range privateAddrs {
			conn, err := s.DialContext(context.Background(), "tcp", net.JoinHostPort(a, "443"))
			if allowPrivate {
				require.NoError(t, err, a)
				conn.Close()
				continue
			}
			require.True(t, isAddrRefused(err), "%s: %v", a, err)
			require.Contains(t, err.Error(), AllowPrivateEnv+"=1", "the refusal says how to allow private ranges")
		}
		for _, a := range publicAddrs {
			conn, err := s.DialContext(context.Background(), "tcp", net.JoinHostPort(a, "443"))
			require.NoError(t, err, a)
			conn.Close()
		}
		want := len(publicAddrs)
		if allowPrivate {
			want += len(privateAddrs)
		}
		require.Len(t, d.addresses(), want, "only allowed addresses are dialled")
		for _, a := range d.addresses() {
			host, _, _ := net.SplitHostPort(a)
			require.False(t, strings.HasPrefix(host, "::ffff:"), "dialled unmapped: %s", a)
		}
		require.True(t, DefaultAllowAddr(netip.MustParseAddr("203.0.113.5")))
		require.False(t, DefaultAllowAddr(netip.MustParseAddr("::ffff:10.1.2.3")))
	}
}

// TestAddrFilterHostAddrs: the host's own addresses are refused even with
// AllowPrivate, as literals, IPv4-mapped, NAT64 and behind names, and an
// address the host gains after the server started is refused from the next
// dial on.
func TestAddrFilterHostAddrs(t *testing.T) {
	own := hostAddrList("198.51.100.7", "10.9.8.7", "2001:db8::7")
	s, d := filterServer(t, true, own, mapResolver{"lan.test": {"10.9.8.7", "198.51.100.7"}})
	for _, a := range []string{"198.51.100.7", "::ffff:198.51.100.7", "10.9.8.7", "::ffff:10.9.8.7", "2001:db8::7", "64:ff9b::c633:6407", "lan.test"} {
		_, err := s.DialContext(context.Background(), "tcp", net.JoinHostPort(a, "80"))
		require.True(t, isAddrRefused(err), "%s: %v", a, err)
		require.Contains(t, err.Error(), "an address of the host itself", a)
	}
	require.Empty(t, d.addresses())

	conn, err := s.DialContext(context.Background(), "tcp", "198.51.100.8:80")
	require.NoError(t, err)
	conn.Close()
	own.mu.Lock()
	own.addrs = append(own.addrs, netip.MustParseAddr("198.51.100.8"))
	own.mu.Unlock()
	_, err = s.DialContext(context.Background(), "tcp", "198.51.100.8:80")
	require.True(t, isAddrRefused(err), "an address added later is refused: %v", err)
	require.Equal(t, []string{"198.51.100.8:80"}, d.addresses())
}

// TestAddrFilterFailsClosed: when the host's addresses cannot be read,
// nothing is dialled.
func TestAddrFilterFailsClosed(t *testing.T) {
	own := &staticAddrs{err: errors.New("netlink is gone")}
	s, d := filterServer(t, false, own, nil)
	_, err := s.DialContext(context.Background(), "tcp", "203.0.113.5:443")
	require.ErrorContains(t, err, "netlink is gone")
	require.Empty(t, d.addresses())
}

// TestAddrFilterMixedAnswers: of a DNS answer mixing allowed and forbidden
// addresses only the allowed ones are dialled, in the answer's order.
func TestAddrFilterMixedAnswers(t *testing.T) {
	r := mapResolver{"mixed.test": {
		"10.0.0.1", "127.0.0.1", "::ffff:169.254.169.254", "203.0.113.5", "0.0.0.0",
		"198.51.100.7", "2001:db8::5", "fd00::1", "::ffff:203.0.113.6",
	}}
	s, d := filterServer(t, false, hostAddrList("198.51.100.7"), r)
	d.succeed = false
	_, err := s.DialContext(context.Background(), "tcp", "mixed.test:443")
	require.ErrorContains(t, err, "recordingDialer")
	require.False(t, isAddrRefused(err))
	require.Equal(t, []string{"203.0.113.5:443", "[2001:db8::5]:443", "203.0.113.6:443"}, d.addresses())

	// Only forbidden addresses: the refusal names them and why.
	r["bad.test"] = []string{"10.0.0.1", "127.0.0.1", "198.51.100.7", "0.0.0.0", "fd00::1", "::1"}
	_, err = s.DialContext(context.Background(), "tcp", "bad.test:443")
	require.Equal(t, guesthost.EgressBlockedByAddressFilter+": bad.test: the guest may not reach 10.0.0.1, private (10.0.0.0/8), "+
		"127.0.0.1, loopback (127.0.0.0/8), 198.51.100.7, an address of the host itself, "+
		`0.0.0.0, "this network" (Linux connects 0.0.0.0 to the host itself) (0.0.0.0/8), and 2 more `+
		"(private ranges are reachable only when the helper runs with "+AllowPrivateEnv+"=1)", err.Error())
	require.Len(t, d.addresses(), 3, "nothing more was dialled")
}

// TestAddrFilterReplyAndLog: through HandleConn, a refusal is a plain
// error reply (not Blocked: the allowlist did allow the host) starting with
// guesthost.EgressBlockedByAddressFilter, and its warning is rate-limited.
func TestAddrFilterReplyAndLog(t *testing.T) {
	var logs bytes.Buffer
	var logMu sync.Mutex
	reg := NewRegistry()
	token, _ := reg.Register("s", []string{"lan.test", "203.0.113.5"})
	d := &recordingDialer{}
	s := NewServer(Config{
		Lookup: reg.Lookup, Resolver: mapResolver{"lan.test": {"192.168.1.20"}}, Dialer: d, HostAddrs: hostAddrList().read,
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil)),
	})
	defer s.Close()
	const tries = 100
	start := time.Now()
	for range tries {
		rep, guest := exchange(t, s, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "lan.test", Port: 443})
		guest.Close()
		require.False(t, rep.OK || rep.Blocked)
		require.True(t, strings.HasPrefix(rep.Error, guesthost.EgressBlockedByAddressFilter+": lan.test: "), rep.Error)
		require.Contains(t, rep.Error, "192.168.1.20, private (192.168.0.0/16)")
	}
	require.Empty(t, d.addresses())
	logMu.Lock()
	lines := strings.Count(logs.String(), "egress refused by the address filter")
	logMu.Unlock()
	require.Positive(t, lines)
	require.LessOrEqual(t, lines, 20*(int(time.Since(start)/time.Second)+1), "the warning is rate-limited (20 a second)")
	require.Less(t, lines, tries)
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// TestAddrFilterRealHostAddr: with the default address source, every
// address of this machine's own interfaces is refused, even with
// AllowPrivate (nothing is dialled: the recording dialer would say).
func TestAddrFilterRealHostAddr(t *testing.T) {
	own, err := hostInterfaceAddrs()
	require.NoError(t, err)
	d := &recordingDialer{}
	s := NewServer(Config{Dialer: d, AllowPrivate: true})
	defer s.Close()
	tested := 0
	for _, a := range own {
		if rangeRefusal(a, true) != "" {
			continue // loopback, link-local: refused by range anyway
		}
		_, err = s.DialContext(context.Background(), "tcp", netip.AddrPortFrom(a, 22).String())
		require.True(t, isAddrRefused(err), "%s: %v", a, err)
		require.Contains(t, err.Error(), "an address of the host itself")
		tested++
	}
	if tested == 0 {
		t.Skip("this machine has no interface address outside loopback and link-local (TestAddrFilterNetns covers one)")
	}
	require.Empty(t, d.addresses())
}

// TestAddrFilterPrivateHintOnlyWhenOff: a private address refused while
// AllowPrivate is already on (here the host's own LAN address) does not
// tell the user to turn AllowPrivateEnv on; with it off, the hint is there.
func TestAddrFilterPrivateHintOnlyWhenOff(t *testing.T) {
	r := mapResolver{"lan.test": {"192.168.1.5"}}
	for _, allowPrivate := range []bool{false, true} {
		s, d := filterServer(t, allowPrivate, hostAddrList("192.168.1.5"), r)
		_, err := s.DialContext(context.Background(), "tcp", "lan.test:443")
		require.True(t, isAddrRefused(err), "allowPrivate %v: %v", allowPrivate, err)
		if allowPrivate {
			require.Equal(t, guesthost.EgressBlockedByAddressFilter+": lan.test: the guest may not reach 192.168.1.5, an address of the host itself", err.Error())
		} else {
			require.Contains(t, err.Error(), AllowPrivateEnv+"=1", "the refusal says how to allow private ranges")
		}
		require.Empty(t, d.addresses())
	}
}
