package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/egress"
	"github.com/cowork-vmm/cowork-vmm/egress/fdpass"
	"github.com/cowork-vmm/cowork-vmm/guest/proxy"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// testResolver maps test names to 127.0.0.1 and nothing else: no test
// traffic leaves loopback.
type testResolver map[string]bool

func (r testResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if r[host] {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

var names = testResolver{
	"allowed.test": true, "blocked.test": true, "api.example.test": true,
	"example.test": true, "evil-example.test": true,
}

// newServer serves reg's policies, letting the guest reach loopback (where
// the test servers are) unless adjust changes the Config.
func newServer(t *testing.T, reg *egress.Registry, adjust ...func(*egress.Config)) *egress.Server {
	t.Helper()
	cfg := egress.Config{
		Lookup:    reg.Lookup,
		Resolver:  names,
		AllowAddr: func(a netip.Addr) bool { return a.IsLoopback() },
	}
	for _, f := range adjust {
		f(&cfg)
	}
	srv := egress.NewServer(cfg)
	t.Cleanup(func() { srv.Close() })
	return srv
}

// pipeDialer hands each connection to the server over net.Pipe.
type pipeDialer struct{ srv *egress.Server }

func (d pipeDialer) DialHost(ctx context.Context) (net.Conn, error) {
	guestEnd, hostEnd := net.Pipe()
	go d.srv.HandleConn(context.Background(), hostEnd)
	return guestEnd, nil
}

// fdpassDialer wires the process backend's transport: a SEQPACKET control
// socket, fdpass.Dialer on the guest side and fdpass.Listener served by the
// egress server on the host side.
func fdpassDialer(t *testing.T, srv *egress.Server) proxy.HostDialer {
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
	agentEnd, helperEnd := wrap(fds[0]), wrap(fds[1])
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { srv.Serve(ctx, fdpass.NewListener(helperEnd)); close(served) }()
	t.Cleanup(func() { cancel(); agentEnd.Close(); <-served })
	return &fdpass.Dialer{Conn: agentEnd}
}

type env struct {
	proxy    *proxy.Proxy
	client   *http.Client
	plainURL func(host string) string
	tlsURL   func(host string) string
	seen     chan *http.Request
}

func setup(t *testing.T, allowed []string, transport string, adjust ...func(*egress.Config)) *env {
	t.Helper()
	seen := make(chan *http.Request, 16)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		seen <- r
		fmt.Fprintf(w, "hello from %s %s body=%s", r.Host, r.URL.Path, body)
	})
	plain := httptest.NewServer(handler)
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(handler)
	t.Cleanup(secure.Close)

	reg := egress.NewRegistry()
	token, _ := reg.Register("spawn-1", allowed)
	srv := newServer(t, reg, adjust...)
	var dialer proxy.HostDialer = pipeDialer{srv}
	if transport == "fdpass" {
		dialer = fdpassDialer(t, srv)
	}
	p, err := proxy.New(proxy.Config{SpawnID: "spawn-1", Token: token, Dial: dialer})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })

	proxyURL, err := url.Parse(p.URL())
	require.NoError(t, err)
	tlsConfig := secure.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	tlsConfig.ServerName = "example.com" // the name in httptest's certificate
	client := &http.Client{Transport: &http.Transport{
		Proxy:             http.ProxyURL(proxyURL),
		TLSClientConfig:   tlsConfig,
		DisableKeepAlives: true,
	}}
	port := func(s *httptest.Server) string { return strconv.Itoa(s.Listener.Addr().(*net.TCPAddr).Port) }
	return &env{
		proxy:    p,
		client:   client,
		plainURL: func(host string) string { return "http://" + host + ":" + port(plain) + "/hello" },
		tlsURL:   func(host string) string { return "https://" + host + ":" + port(secure) + "/hello" },
		seen:     seen,
	}
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body), resp.Header
}

func TestAllowedDomainAnswers(t *testing.T) {
	for _, transport := range []string{"pipe", "fdpass"} {
		t.Run(transport, func(t *testing.T) {
			e := setup(t, []string{"allowed.test"}, transport)

			status, body, _ := get(t, e.client, e.plainURL("allowed.test"))
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, body, "hello from allowed.test:")
			r := <-e.seen
			require.Equal(t, "/hello", r.RequestURI, "forwarded in origin form")
			require.Empty(t, r.Header.Get("Proxy-Connection"))

			status, body, _ = get(t, e.client, e.tlsURL("allowed.test"))
			require.Equal(t, http.StatusOK, status, "CONNECT tunnel")
			require.Contains(t, body, "hello from allowed.test:")
			<-e.seen

			resp, err := e.client.Post(e.plainURL("allowed.test"), "text/plain", strings.NewReader("payload"))
			require.NoError(t, err)
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Contains(t, string(got), "body=payload")
			<-e.seen
		})
	}
}

func TestBlockedDomainGets403(t *testing.T) {
	e := setup(t, []string{"allowed.test"}, "pipe")
	status, body, header := get(t, e.client, e.plainURL("blocked.test"))
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "blocked-by-allowlist", header.Get("X-Cowork-Egress"))
	require.Equal(t, "blocked-by-allowlist: blocked.test\n", body)

	resp := rawConnect(t, e.proxy, e.tlsURL("blocked.test"))
	require.Equal(t, http.StatusForbidden, resp.status)
	require.Equal(t, "blocked-by-allowlist", resp.header.Get("X-Cowork-Egress"))
	require.Equal(t, "blocked-by-allowlist: blocked.test\n", resp.body)

	_, err := e.client.Get(e.tlsURL("blocked.test"))
	require.ErrorContains(t, err, "Forbidden")
}

// TestAddressFilterRefusalGets403: an allowed name whose address the
// helper's address filter refuses (here loopback: the host's own) is a 403
// naming the filter, as an allowlist refusal is, for a plain request and a
// CONNECT alike; other failures stay 502s.
func TestAddressFilterRefusalGets403(t *testing.T) {
	e := setup(t, []string{"allowed.test", "nxdomain.test"}, "pipe", func(c *egress.Config) { c.AllowAddr = nil })
	status, body, header := get(t, e.client, e.plainURL("allowed.test"))
	require.Equal(t, http.StatusForbidden, status, body)
	require.Equal(t, guesthost.EgressBlockedByAddressFilter, header.Get(guesthost.EgressRefusalHeader))
	require.True(t, strings.HasPrefix(body, guesthost.EgressBlockedByAddressFilter+": allowed.test: "), body)
	require.Contains(t, body, "127.0.0.1")

	resp := rawConnect(t, e.proxy, e.tlsURL("allowed.test"))
	require.Equal(t, http.StatusForbidden, resp.status)
	require.Equal(t, "blocked-by-address-filter", resp.header.Get("X-Cowork-Egress"))
	require.True(t, strings.HasPrefix(resp.body, guesthost.EgressBlockedByAddressFilter+": "), resp.body)

	status, _, header = get(t, e.client, "http://nxdomain.test/")
	require.Equal(t, http.StatusBadGateway, status, "not the filter's refusal")
	require.Empty(t, header.Get(guesthost.EgressRefusalHeader))
}

func TestWildcard(t *testing.T) {
	e := setup(t, []string{"*.example.test"}, "pipe")
	status, _, _ := get(t, e.client, e.plainURL("api.example.test"))
	require.Equal(t, http.StatusOK, status)
	<-e.seen
	status, _, _ = get(t, e.client, e.tlsURL("api.example.test"))
	require.Equal(t, http.StatusOK, status)
	<-e.seen
	for _, host := range []string{"evil-example.test", "example.test"} {
		status, body, _ := get(t, e.client, e.plainURL(host))
		require.Equal(t, http.StatusForbidden, status, host)
		require.Equal(t, "blocked-by-allowlist: "+host+"\n", body)
	}
}

func TestIPLiteralNeedsListing(t *testing.T) {
	e := setup(t, []string{"allowed.test"}, "pipe")
	status, _, _ := get(t, e.client, e.plainURL("127.0.0.1"))
	require.Equal(t, http.StatusForbidden, status)

	e = setup(t, []string{"127.0.0.1"}, "pipe")
	status, _, _ = get(t, e.client, e.plainURL("127.0.0.1"))
	require.Equal(t, http.StatusOK, status)
}

func TestEmptyListRefusesAllAbsentAllowsAll(t *testing.T) {
	e := setup(t, []string{}, "pipe")
	status, _, _ := get(t, e.client, e.plainURL("allowed.test"))
	require.Equal(t, http.StatusForbidden, status)

	e = setup(t, nil, "pipe")
	status, _, _ = get(t, e.client, e.plainURL("blocked.test"))
	require.Equal(t, http.StatusOK, status)
}

func TestFailuresAre502(t *testing.T) {
	e := setup(t, nil, "pipe")
	status, body, _ := get(t, e.client, "http://nxdomain.test/")
	require.Equal(t, http.StatusBadGateway, status)
	require.Contains(t, body, "nxdomain.test")

	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().(*net.TCPAddr).Port
	l.Close()
	status, body, _ = get(t, e.client, fmt.Sprintf("http://allowed.test:%d/", closed))
	require.Equal(t, http.StatusBadGateway, status)
	require.Contains(t, body, "connect")
}

func TestWrongTokenIsRefused(t *testing.T) {
	reg := egress.NewRegistry()
	reg.Register("spawn-1", nil)
	srv := newServer(t, reg)
	p, err := proxy.New(proxy.Config{SpawnID: "spawn-1", Token: "forged", Dial: pipeDialer{srv}})
	require.NoError(t, err)
	defer p.Close()
	resp := rawConnect(t, p, "https://allowed.test:443/")
	require.Equal(t, http.StatusBadGateway, resp.status)
	require.Contains(t, resp.body, "no egress registered")
}

func TestBadRequestsAre400(t *testing.T) {
	e := setup(t, nil, "pipe")
	for _, raw := range []string{
		"GET /origin-form HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"CONNECT allowed.test HTTP/1.1\r\n\r\n",
		"CONNECT allowed.test:0 HTTP/1.1\r\n\r\n",
		"GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http://user:pw@allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"garbage\r\n\r\n",
	} {
		resp := rawExchange(t, e.proxy, raw)
		require.Equal(t, http.StatusBadRequest, resp.status, raw)
	}
	huge := "GET http://allowed.test/ HTTP/1.1\r\nX: " + strings.Repeat("a", 200*1024) + "\r\n\r\n"
	resp := rawExchange(t, e.proxy, huge)
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.status)
}

func TestProxyEnv(t *testing.T) {
	got := proxy.MergeEnv([]string{"PATH=/bin", "https_proxy=http://evil", "ALL_PROXY=x", "HOME=/h"}, "http://127.0.0.1:9")
	require.Equal(t, []string{
		"PATH=/bin", "HOME=/h",
		"HTTPS_PROXY=http://127.0.0.1:9", "HTTP_PROXY=http://127.0.0.1:9",
		"https_proxy=http://127.0.0.1:9", "http_proxy=http://127.0.0.1:9",
		"NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1",
	}, got)
}

type rawResponse struct {
	status int
	header http.Header
	body   string
}

func rawConnect(t *testing.T, p *proxy.Proxy, target string) rawResponse {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	return rawExchange(t, p, "CONNECT "+u.Host+" HTTP/1.1\r\nHost: "+u.Host+"\r\n\r\n")
}

func rawExchange(t *testing.T, p *proxy.Proxy, request string) rawResponse {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	go io.WriteString(c, request) // the proxy may answer before reading it all
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return rawResponse{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

// TestConnectionLimit: with MaxConns 1, a second client is turned away with
// 503 while a tunnel is open, and served once it closed.
func TestConnectionLimit(t *testing.T) {
	reg := egress.NewRegistry()
	token, _ := reg.Register("spawn-1", nil)
	srv := newServer(t, reg)
	p, err := proxy.New(proxy.Config{SpawnID: "spawn-1", Token: token, Dial: pipeDialer{srv}, MaxConns: 1})
	require.NoError(t, err)
	defer p.Close()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	port := upstream.Listener.Addr().(*net.TCPAddr).Port

	tunnel, err := net.Dial("tcp", p.Addr().String())
	require.NoError(t, err)
	fmt.Fprintf(tunnel, "CONNECT allowed.test:%d HTTP/1.1\r\n\r\n", port)
	br := bufio.NewReader(tunnel)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	second := rawExchange(t, p, "CONNECT allowed.test:1 HTTP/1.1\r\n\r\n")
	require.Equal(t, http.StatusServiceUnavailable, second.status)

	tunnel.Close()
	// The slot frees once the tunnel's handler noticed; retry until it has
	// (no timing assumption: each attempt is a full exchange).
	for {
		r := rawExchange(t, p, fmt.Sprintf("GET http://allowed.test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", port))
		if r.status == http.StatusOK {
			break
		}
		require.Equal(t, http.StatusServiceUnavailable, r.status)
	}
}
