package egress

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// fakeProxy is an HTTP CONNECT proxy on 127.0.0.1 that connects nowhere:
// it records each CONNECT, answers with status, and on 2xx greets with
// "hello TARGET\n" in the same write as its reply (a server that speaks
// first) and then echoes. With silent it reads the request and never
// answers.
type fakeProxy struct {
	addr   string
	status string
	silent bool

	mu       sync.Mutex
	requests []*http.Request
}

func newFakeProxy(t *testing.T, status string) *fakeProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &fakeProxy{addr: l.Addr().String(), status: status}
	var conns sync.WaitGroup
	t.Cleanup(func() { l.Close(); conns.Wait() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() { defer conns.Done(); p.serve(c) }()
		}
	}()
	return p
}

func (p *fakeProxy) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.requests = append(p.requests, req)
	p.mu.Unlock()
	if p.silent {
		_, _ = io.Copy(io.Discard, br)
		return
	}
	if !strings.HasPrefix(p.status, "2") {
		_, _ = io.WriteString(c, "HTTP/1.1 "+p.status+"\r\nContent-Length: 0\r\n\r\n")
		return
	}
	_, _ = io.WriteString(c, "HTTP/1.1 "+p.status+"\r\n\r\nhello "+req.RequestURI+"\n")
	_, _ = io.Copy(c, br)
}

func (p *fakeProxy) seen() []*http.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*http.Request(nil), p.requests...)
}

// loopbackDialer really dials 127.0.0.1 (the fake proxy) and records and
// fails every other address, so no test traffic leaves loopback.
type loopbackDialer struct {
	recordingDialer
	net net.Dialer
}

func (d *loopbackDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if host, _, err := net.SplitHostPort(address); err == nil && host == "127.0.0.1" {
		return d.net.DialContext(ctx, network, address)
	}
	return d.recordingDialer.DialContext(ctx, network, address)
}

// proxiedServer is a server with the default address filter whose upstream
// proxy is p (user "user", password "p@ss"), NO_PROXY noProxy.
func proxiedServer(t *testing.T, p *fakeProxy, noProxy string, reg *Registry) (*Server, *loopbackDialer) {
	t.Helper()
	d := &loopbackDialer{}
	s := NewServer(Config{
		Lookup: reg.Lookup, Dialer: d, HostAddrs: hostAddrList().read, DialTimeout: 2 * time.Second,
		Resolver:      mapResolver{"direct.test": {"203.0.113.9"}, "allowed.test": {"127.0.0.1"}},
		UpstreamProxy: NewUpstreamProxy("http://user:p%40ss@"+p.addr, noProxy),
	})
	t.Cleanup(func() { s.Close() })
	return s, d
}

// TestUpstreamProxyConnect: an allowed host goes to the proxy as CONNECT
// host:port with the credentials of the proxy URL, the proxy's early bytes
// and the tunnel reach the guest, and the proxy itself may be on loopback.
// A host the policy refuses, one NO_PROXY excludes, and forbidden IP
// literals or localhost names never reach the proxy.
func TestUpstreamProxyConnect(t *testing.T) {
	p := newFakeProxy(t, "200 Connection established")
	reg := NewRegistry()
	token, _ := reg.Register("s", []string{"allowed.test", "direct.test"})
	openToken, _ := reg.Register("open", nil)
	s, d := proxiedServer(t, p, "direct.test,10.0.0.0/8", reg)

	rep, guest := exchange(t, s, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "allowed.test", Port: 443})
	require.True(t, rep.OK, rep.Error)
	br := bufio.NewReader(guest)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "hello allowed.test:443\n", line, "the proxy's early bytes are kept")
	_, err = guest.Write([]byte("ping\n"))
	require.NoError(t, err)
	line, err = br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ping\n", line)
	guest.Close()
	seen := p.seen()
	require.Len(t, seen, 1)
	require.Equal(t, http.MethodConnect, seen[0].Method)
	require.Equal(t, "allowed.test:443", seen[0].Host)
	require.Equal(t, "Basic dXNlcjpwQHNz", seen[0].Header.Get("Proxy-Authorization"), "user:p@ss")

	rep, guest = exchange(t, s, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "other.test", Port: 443})
	guest.Close()
	require.True(t, rep.Blocked, "the allowlist comes first")

	rep, guest = exchange(t, s, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "direct.test", Port: 443})
	guest.Close()
	require.False(t, rep.OK)
	require.Equal(t, []string{"203.0.113.9:443"}, d.addresses(), "NO_PROXY hosts are dialled directly")

	for _, host := range []string{"10.1.2.3", "127.0.0.1", "::ffff:127.0.0.1", "169.254.169.254", "0.0.0.0", "localhost", "a.localhost"} {
		rep, guest = exchange(t, s, protocol.EgressRequest{SpawnID: "open", Token: openToken, Host: host, Port: 22})
		guest.Close()
		require.False(t, rep.OK || rep.Blocked, host)
		require.True(t, strings.HasPrefix(rep.Error, guesthost.EgressBlockedByAddressFilter), "%s: %s", host, rep.Error)
	}
	require.Len(t, p.seen(), 1, "refused targets never reach the proxy")
	require.Len(t, d.addresses(), 1)

	for _, target := range []struct{ host, connect string }{
		{"203.0.113.7", "203.0.113.7:443"}, {"2001:db8::1", "[2001:db8::1]:443"},
	} {
		rep, guest = exchange(t, s, protocol.EgressRequest{SpawnID: "open", Token: openToken, Host: target.host, Port: 443})
		guest.Close()
		require.True(t, rep.OK, rep.Error)
		seen = p.seen()
		require.Equal(t, target.connect, seen[len(seen)-1].Host)
	}

	// The helper's own probe (DialContext) takes the same way out.
	conn, err := s.DialContext(context.Background(), "tcp", "api.probe.test:443")
	require.NoError(t, err)
	conn.Close()
	seen = p.seen()
	require.Equal(t, "api.probe.test:443", seen[len(seen)-1].Host)
}

// TestUpstreamProxyRefusal: a proxy's refusal reaches the guest with its
// status (and a hint for 407), never with the proxy's password; a proxy
// that never answers is given up after DialTimeout.
func TestUpstreamProxyRefusal(t *testing.T) {
	reg := NewRegistry()
	token, _ := reg.Register("s", nil)
	for _, c := range []struct{ status, want string }{
		{"403 Forbidden", "answered CONNECT a.test:443 with 403 Forbidden"},
		{"407 Proxy Authentication Required", "wants credentials"},
		{"502 Bad Gateway", "502 Bad Gateway"},
	} {
		p := newFakeProxy(t, c.status)
		s, _ := proxiedServer(t, p, "", reg)
		rep, guest := exchange(t, s, protocol.EgressRequest{SpawnID: "s", Token: token, Host: "a.test", Port: 443})
		guest.Close()
		require.False(t, rep.OK)
		require.Contains(t, rep.Error, c.want)
		require.Contains(t, rep.Error, "http://user:xxxxx@127.0.0.1:")
		require.NotContains(t, rep.Error, "p@ss")
		require.NotContains(t, rep.Error, "p%40ss")
	}

	p := newFakeProxy(t, "")
	p.silent = true
	s, _ := proxiedServer(t, p, "", reg)
	s.cfg.DialTimeout = 200 * time.Millisecond
	start := time.Now()
	_, err := s.DialContext(context.Background(), "tcp", "a.test:443")
	require.Error(t, err)
	require.Less(t, time.Since(start), 5*time.Second)
}

// TestUpstreamProxyUnusable: a setting egress cannot use fails each proxied
// connection with a clear error and dials nothing; NO_PROXY hosts still go
// directly.
func TestUpstreamProxyUnusable(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{"socks5://127.0.0.1:1080", "only http:// proxies are supported"},
		{"https://user:secret@proxy.test", "only http:// proxies are supported"},
		{"http://:3128", "names no host"},
		{"http://proxy.test:99999", "bad port"},
		{"http://proxy.test:%zz", "not a URL"},
	} {
		d := &recordingDialer{}
		s := NewServer(Config{Dialer: d, HostAddrs: hostAddrList().read, Resolver: mapResolver{"direct.test": {"203.0.113.9"}},
			UpstreamProxy: NewUpstreamProxy(c.raw, ".direct.test")})
		_, err := s.DialContext(context.Background(), "tcp", "a.test:443")
		require.ErrorContains(t, err, c.want, c.raw)
		require.NotContains(t, err.Error(), "secret")
		require.Empty(t, d.addresses(), c.raw)
		_, err = s.DialContext(context.Background(), "tcp", "direct.test:443")
		require.ErrorContains(t, err, "recordingDialer")
		require.Equal(t, []string{"203.0.113.9:443"}, d.addresses())
		s.Close()
	}

	// Without a scheme http:// is meant, and the port defaults to 80.
	d := &recordingDialer{}
	s := NewServer(Config{Dialer: d, UpstreamProxy: NewUpstreamProxy("proxy.test", "")})
	defer s.Close()
	_, err := s.DialContext(context.Background(), "tcp", "a.test:443")
	require.ErrorContains(t, err, "connecting to the upstream proxy http://proxy.test")
	require.Equal(t, []string{"proxy.test:80"}, d.addresses())
}

// TestUpstreamProxyFromEnv: which variable wins, NO_PROXY's two spellings,
// and a String that hides the password.
func TestUpstreamProxyFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	require.Nil(t, UpstreamProxyFromEnv(env()))
	require.Nil(t, UpstreamProxyFromEnv(env("NO_PROXY", "a.test", "https_proxy", "  ")))
	all := []string{"https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"}
	for i, winner := range all {
		var kv []string
		for _, name := range all[i:] {
			kv = append(kv, name, "http://"+strings.ToLower(name)+".test:3128")
		}
		p := UpstreamProxyFromEnv(env(kv...))
		require.NotNil(t, p)
		require.Equal(t, winner+"=http://"+strings.ToLower(winner)+".test:3128", p.String())
		require.NoError(t, p.Err())
	}
	p := UpstreamProxyFromEnv(env("HTTP_PROXY", "http://u:secret@proxy.test:8080", "NO_PROXY", "b.test", "no_proxy", "a.test"))
	require.Equal(t, "HTTP_PROXY=http://u:xxxxx@proxy.test:8080 (NO_PROXY=a.test)", p.String())
	require.True(t, p.route("b.test", 443))
	require.False(t, p.route("a.test", 443))
	p = UpstreamProxyFromEnv(env("ALL_PROXY", "socks5h://proxy.test", "NO_PROXY", "b.test"))
	require.ErrorContains(t, p.Err(), "only http://")
	require.Equal(t, "ALL_PROXY=invalid (NO_PROXY=b.test)", p.String())
	require.Equal(t, "none", (*UpstreamProxy)(nil).String())
	require.False(t, (*UpstreamProxy)(nil).route("a.test", 443), "no proxy: everything direct")
}

// TestNoProxy: every NO_PROXY form.
func TestNoProxy(t *testing.T) {
	l := parseNoProxy(" example.com, .dot.test,*.star.test , 10.0.0.0/8, 192.0.2.1, [2001:db8::1]:443, port.test:8080, 2001:db8:1::/48,,bad entry")
	for _, c := range []struct {
		host   string
		port   int
		direct bool
	}{
		{"example.com", 443, true}, {"a.example.com", 443, true}, {"EXAMPLE.com.", 443, true}, {"notexample.com", 443, false},
		{"dot.test", 443, true}, {"a.dot.test", 443, true}, {"star.test", 443, true}, {"a.b.star.test", 443, true},
		{"10.1.2.3", 443, true}, {"::ffff:10.1.2.3", 443, true}, {"11.0.0.1", 443, false},
		{"192.0.2.1", 80, true}, {"192.0.2.2", 80, false},
		{"2001:db8::1", 443, true}, {"2001:db8::1", 80, false}, {"2001:db8:1::5", 80, true},
		{"port.test", 8080, true}, {"a.port.test", 8080, true}, {"port.test", 443, false},
		{"other.test", 443, false},
	} {
		require.Equal(t, c.direct, l.matches(c.host, c.port), "%s port %d", c.host, c.port)
	}
	require.True(t, parseNoProxy("a.test, *").matches("anything.test", 1))
	require.False(t, parseNoProxy("").matches("anything.test", 1), "an empty NO_PROXY excludes nothing")
	require.False(t, parseNoProxy(" , ").matches("anything.test", 1))
}
