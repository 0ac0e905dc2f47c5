package egress

import (
	"bufio"
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The upstream proxy: the host's own proxy setting (https_proxy and its
// kin), which a user behind a corporate proxy needs for any network at all.
// The policy is enforced on the requested host first; then a connection
// NO_PROXY does not exclude goes to the proxy as an HTTP CONNECT tunnel to
// host:port, and the proxy resolves and connects. The proxy's own address
// is not filtered: it is the user's setting, and it is often on the host
// (127.0.0.1:3128, a cntlm or px) or on the private network — exactly what
// the filter would refuse. Only targets are filtered: an IP literal target
// goes through the same address filter before it is sent to the proxy (a
// proxy on the host would otherwise connect the guest to the host's
// loopback), and names under "localhost" are refused. Which address an
// allowed name reaches through the proxy is the proxy's decision: the host
// may not even resolve external names behind one.

// proxyVars are read in this order; the first one set is the proxy. Every
// connection is a CONNECT tunnel, which is what HTTPS proxies carry, so the
// https variables come first, but a host that only sets http_proxy means
// the same proxy for everything. Lower case first, as Go and curl do.
var proxyVars = []string{"https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"}

// maxProxyReply bounds the upstream proxy's reply to CONNECT.
const maxProxyReply = 16 * 1024

// UpstreamProxy is the host's proxy setting. Build it with
// UpstreamProxyFromEnv or NewUpstreamProxy; a nil *UpstreamProxy dials
// everything directly.
type UpstreamProxy struct {
	url     *url.URL // nil when err is set
	source  string   // the variable it came from, for logs
	noProxy string
	err     error // the setting is unusable: every proxied connection fails with it
	direct  noProxyList
}

// UpstreamProxyFromEnv reads the proxy variables (https_proxy,
// HTTPS_PROXY, http_proxy, HTTP_PROXY, all_proxy, ALL_PROXY: the first set)
// and no_proxy / NO_PROXY through getenv (os.Getenv). Nil when none is set.
func UpstreamProxyFromEnv(getenv func(string) string) *UpstreamProxy {
	for _, name := range proxyVars {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			noProxy := getenv("no_proxy")
			if noProxy == "" {
				noProxy = getenv("NO_PROXY")
			}
			p := NewUpstreamProxy(v, noProxy)
			p.source = name
			return p
		}
	}
	return nil
}

// NewUpstreamProxy makes the proxy of rawURL ("http://[user:pass@]host[:port]";
// without a scheme, http:// is meant; the port defaults to 80, as in Go's
// net/http) with noProxy's exclusions. Only http:// proxies are supported:
// an https:// or socks5:// setting makes every proxied connection fail with
// an error that says so, rather than go out directly behind the user's back.
func NewUpstreamProxy(rawURL, noProxy string) *UpstreamProxy {
	p := &UpstreamProxy{source: "proxy", noProxy: noProxy, direct: parseNoProxy(noProxy)}
	if !strings.Contains(rawURL, "://") {
		rawURL = "http://" + rawURL
	}
	u, err := url.Parse(rawURL)
	switch {
	case err != nil:
		// url.Error quotes the URL, password included; say less.
		p.err = fmt.Errorf("the upstream proxy setting is not a URL")
	case u.Scheme != "http":
		p.err = fmt.Errorf("the upstream proxy %s: only http:// proxies are supported", u.Redacted())
	case u.Hostname() == "":
		p.err = fmt.Errorf("the upstream proxy %s names no host", u.Redacted())
	case u.Port() != "" && parsePort(u.Port()) == 0:
		p.err = fmt.Errorf("the upstream proxy %s has a bad port", u.Redacted())
	default:
		p.url = u
	}
	return p
}

// String describes the setting for logs, without its password.
func (p *UpstreamProxy) String() string {
	if p == nil {
		return "none"
	}
	what := "invalid"
	if p.url != nil {
		what = p.url.Redacted()
	}
	if p.noProxy != "" {
		return fmt.Sprintf("%s=%s (NO_PROXY=%s)", p.source, what, p.noProxy)
	}
	return p.source + "=" + what
}

// Err is why the setting is unusable, nil when it is usable.
func (p *UpstreamProxy) Err() error { return p.err }

// route says whether host:port goes through the proxy.
func (p *UpstreamProxy) route(host string, port int) bool {
	return p != nil && !p.direct.matches(host, port)
}

// noProxyList is a parsed NO_PROXY, read as curl reads it: entries are
// separated by commas; "*" excludes every host; a name, with or without a
// leading "." or "*.", excludes itself and every name below it; an IP
// literal or a CIDR prefix excludes those addresses (given as literals);
// a ":port" suffix limits an entry to that port. Go's net/http differs only
// in reading ".example.com" as the subdomains alone.
type noProxyList struct {
	hosts Policy // the entries as allowedDomains (".name" forms)
	nets  []netip.Prefix
}

func parseNoProxy(s string) noProxyList {
	var l noProxyList
	entries := []string{} // not nil: ParsePolicy(nil) would allow every host
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		if prefix, err := netip.ParsePrefix(e); err == nil {
			l.nets = append(l.nets, prefix.Masked())
			continue
		}
		host := e
		if h, _, err := net.SplitHostPort(e); err == nil {
			host = h
		}
		if _, isIP := parseIPLiteral(host); !isIP && host != "*" && !strings.HasPrefix(e, "[") {
			e = "." + strings.TrimPrefix(strings.TrimPrefix(e, "*"), ".")
		}
		entries = append(entries, e)
	}
	l.hosts = ParsePolicy(entries)
	return l
}

func (l noProxyList) matches(host string, port int) bool {
	if l.hosts.AllowsPort(host, port) {
		return true
	}
	if addr, ok := parseIPLiteral(host); ok {
		for _, n := range l.nets {
			if n.Contains(addr) {
				return true
			}
		}
	}
	return false
}

// connect opens a CONNECT tunnel to host:port through the proxy, dialling
// the proxy with d. Bytes the proxy sent after its reply (a server that
// speaks first) are kept for the tunnel's first reads.
func (p *UpstreamProxy) connect(ctx context.Context, d Dialer, host string, port int) (net.Conn, error) {
	if p.err != nil {
		return nil, fmt.Errorf("%s: %w", p.source, p.err)
	}
	proxyAddr := net.JoinHostPort(p.url.Hostname(), cmp.Or(p.url.Port(), "80"))
	conn, err := d.DialContext(ctx, "tcp", proxyAddr)
	if err != nil {
		return nil, fmt.Errorf("connecting to the upstream proxy %s: %w", p.url.Redacted(), err)
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	tunnel, err := p.handshake(conn, net.JoinHostPort(host, strconv.Itoa(port)))
	if !stop() && err == nil {
		err = ctx.Err() // the deadline may have been cut under the tunnel
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return tunnel, nil
}

// handshake sends CONNECT target and reads the proxy's reply.
func (p *UpstreamProxy) handshake(conn net.Conn, target string) (net.Conn, error) {
	var req strings.Builder
	fmt.Fprintf(&req, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target)
	if u := p.url.User; u != nil {
		pass, _ := u.Password()
		fmt.Fprintf(&req, "Proxy-Authorization: Basic %s\r\n", base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pass)))
	}
	req.WriteString("\r\n")
	if _, err := io.WriteString(conn, req.String()); err != nil {
		return nil, fmt.Errorf("sending CONNECT to the upstream proxy %s: %w", p.url.Redacted(), err)
	}
	br := bufio.NewReader(&io.LimitedReader{R: conn, N: maxProxyReply})
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return nil, fmt.Errorf("reading the upstream proxy %s's reply to CONNECT %s: %w", p.url.Redacted(), target, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		hint := ""
		if resp.StatusCode == http.StatusProxyAuthRequired {
			hint = " (it wants credentials: put user:password@ in the proxy variable)"
		}
		return nil, fmt.Errorf("the upstream proxy %s answered CONNECT %s with %s%s", p.url.Redacted(), target, resp.Status, hint)
	}
	if n := br.Buffered(); n > 0 {
		early := make([]byte, n)
		_, _ = io.ReadFull(br, early)
		return &prefixConn{Conn: conn, prefix: early}, nil
	}
	return conn, nil
}

// prefixConn reads prefix before the connection's own bytes.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// CloseWrite keeps the half-close that splice relies on.
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("egress: the connection cannot half-close")
}

// isLocalhostName reports names that mean the host's loopback (RFC 6761).
func isLocalhostName(name string) bool {
	return name == "localhost" || strings.HasSuffix(name, ".localhost")
}
