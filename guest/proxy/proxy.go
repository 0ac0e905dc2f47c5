package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/egress/splice"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// HostDialer opens one connection to the helper's egress service.
type HostDialer interface {
	DialHost(ctx context.Context) (net.Conn, error)
}

// Defaults of Config's limits.
const (
	DefaultMaxConns         = 64
	DefaultMaxHeaderBytes   = 64 * 1024
	DefaultHeaderTimeout    = 30 * time.Second
	DefaultHandshakeTimeout = 30 * time.Second // the helper dials within 15 s
	DefaultIdleTimeout      = 10 * time.Minute
)

// A refusal is a 403 whose guesthost.EgressRefusalHeader says who refused:
// guesthost.EgressBlockedByAllowlist (allowedDomains) or
// guesthost.EgressBlockedByAddressFilter (the helper's address filter: an
// allowed name that leads to an address the guest may not reach: the host,
// link-local, a private range).

// Config configures one spawn's proxy. SpawnID and Dial are required.
type Config struct {
	SpawnID string
	// Token is the spawn's egress token from the helper (SpawnParams).
	Token  string
	Dial   HostDialer
	Logger *slog.Logger
	// Listener, if set, is served instead of a new 127.0.0.1:0 listener
	// (netns.Namespace.Listen makes one inside the spawn's namespace). The
	// proxy owns and closes it.
	Listener         net.Listener
	MaxConns         int
	MaxHeaderBytes   int
	HeaderTimeout    time.Duration
	HandshakeTimeout time.Duration
	IdleTimeout      time.Duration
}

// Proxy is one running proxy.
type Proxy struct {
	cfg   Config
	log   *slog.Logger
	l     net.Listener
	slots chan struct{}
	// ctx ends with Close, cutting short dials and handshakes with the host.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// New starts serving. Close it when the spawn exits.
func New(cfg Config) (*Proxy, error) {
	if cfg.SpawnID == "" || cfg.Dial == nil {
		return nil, errors.New("proxy: a spawn id and a host dialer are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = DefaultHeaderTimeout
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	l := cfg.Listener
	if l == nil {
		var err error
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("proxy: listening on guest loopback for spawn %s: %w", cfg.SpawnID, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		ctx:    ctx,
		cancel: cancel,
		cfg:    cfg,
		log:    cfg.Logger.With("spawn", cfg.SpawnID),
		l:      l,
		slots:  make(chan struct{}, cfg.MaxConns),
		conns:  map[net.Conn]struct{}{},
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the listening address (127.0.0.1:port).
func (p *Proxy) Addr() net.Addr { return p.l.Addr() }

// URL is the proxy URL for the environment, "http://127.0.0.1:port".
func (p *Proxy) URL() string { return "http://" + p.l.Addr().String() }

// Env is the environment a spawned process needs to use the proxy.
func (p *Proxy) Env() []string { return ProxyEnv(p.URL()) }

// ProxyEnv lists the proxy variables for proxyURL, upper and lower case
// (curl reads only http_proxy in lower case; others read either).
func ProxyEnv(proxyURL string) []string {
	return []string{
		"HTTPS_PROXY=" + proxyURL, "HTTP_PROXY=" + proxyURL,
		"https_proxy=" + proxyURL, "http_proxy=" + proxyURL,
		"NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1",
	}
}

// MergeEnv returns env with every proxy variable replaced by ProxyEnv's:
// a process cannot be pointed elsewhere (nothing else is reachable anyway).
// ALL_PROXY is dropped for the same reason.
func MergeEnv(env []string, proxyURL string) []string {
	out := make([]string, 0, len(env)+6)
	for _, kv := range env {
		key, _, _ := strings.Cut(kv, "=")
		switch strings.ToUpper(key) {
		case "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "ALL_PROXY":
			continue
		}
		out = append(out, kv)
	}
	return append(out, ProxyEnv(proxyURL)...)
}

// Close stops listening, ends every connection and waits for them.
func (p *Proxy) Close() error {
	p.cancel()
	p.mu.Lock()
	p.closed = true
	err := p.l.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		conn, err := p.l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if !errors.Is(err, net.ErrClosed) {
				p.log.Warn("proxy stopped accepting", "err", err)
			}
			return
		}
		if !p.track(conn) {
			conn.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(conn)
			defer conn.Close()
			select {
			case p.slots <- struct{}{}:
				defer func() { <-p.slots }()
				p.handle(conn)
			default:
				writeError(conn, http.StatusServiceUnavailable, "", fmt.Sprintf("the proxy already carries %d connections for this process", p.cfg.MaxConns))
			}
		}()
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// handle serves one client connection: one CONNECT tunnel or one request.
func (p *Proxy) handle(conn net.Conn) {
	_ = conn.SetReadDeadline(time.Now().Add(p.cfg.HeaderTimeout))
	limit := &headerLimit{r: conn, remaining: p.cfg.MaxHeaderBytes}
	br := bufio.NewReaderSize(limit, 4096)
	req, t, err := readProxyRequest(br)
	if err != nil {
		status := http.StatusBadRequest
		if limit.exceeded {
			status = http.StatusRequestHeaderFieldsTooLarge
		}
		if !errors.Is(err, io.EOF) {
			writeError(conn, status, "", err.Error())
		}
		return
	}
	// From here the client is bounded by idleness, not by the header limit.
	limit.lift()
	limit.r = &idleConn{Conn: conn, idle: p.cfg.IdleTimeout}
	_ = conn.SetReadDeadline(time.Time{})

	up, ok := p.open(conn, t)
	if !ok {
		return
	}
	defer up.Close()
	if req.Method == http.MethodConnect {
		if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
		splice.Pair(conn, br, up, p.cfg.IdleTimeout)
		return
	}
	p.forward(conn, req, up)
}

// open asks the helper for a connection to t and answers the client itself
// when that fails.
func (p *Proxy) open(conn net.Conn, t target) (net.Conn, bool) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.HandshakeTimeout)
	defer cancel()
	up, err := p.cfg.Dial.DialHost(ctx)
	if err != nil {
		p.log.Warn("proxy cannot reach the helper's egress service", "err", err)
		writeError(conn, http.StatusBadGateway, "", "cannot reach the helper's egress service: "+err.Error())
		return nil, false
	}
	deadline, _ := ctx.Deadline()
	_ = up.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { up.SetDeadline(time.Unix(1, 0)) }) // Close cuts the handshake short
	rep, err := p.handshake(up, t)
	stop()
	if err != nil {
		up.Close()
		writeError(conn, http.StatusBadGateway, "", "the helper's egress service failed: "+err.Error())
		return nil, false
	}
	if !rep.OK {
		up.Close()
		switch {
		case rep.Blocked:
			p.log.Debug("egress blocked by allowedDomains", "host", t.host, "port", t.port)
			writeError(conn, http.StatusForbidden, guesthost.EgressBlockedByAllowlist, guesthost.EgressBlockedByAllowlist+": "+t.host)
		case strings.HasPrefix(rep.Error, guesthost.EgressBlockedByAddressFilter):
			p.log.Debug("egress blocked by the address filter", "host", t.host, "port", t.port)
			writeError(conn, http.StatusForbidden, guesthost.EgressBlockedByAddressFilter, rep.Error)
		default:
			writeError(conn, http.StatusBadGateway, "", fmt.Sprintf("egress to %s failed: %s", net.JoinHostPort(t.host, strconv.Itoa(t.port)), rep.Error))
		}
		return nil, false
	}
	_ = up.SetDeadline(time.Time{})
	return up, true
}

func (p *Proxy) handshake(up net.Conn, t target) (protocol.EgressReply, error) {
	req := protocol.EgressRequest{SpawnID: p.cfg.SpawnID, Token: p.cfg.Token, Host: t.host, Port: t.port}
	if err := protocol.WriteEgressRequest(up, req); err != nil {
		return protocol.EgressReply{}, err
	}
	return protocol.ReadEgressReply(up)
}

// forward sends one plain HTTP request upstream in origin form and relays
// its response; the client connection closes afterwards (no keep-alive).
func (p *Proxy) forward(conn net.Conn, req *http.Request, up net.Conn) {
	idleUp := &idleConn{Conn: up, idle: p.cfg.IdleTimeout}
	idleClient := &idleConn{Conn: conn, idle: p.cfg.IdleTimeout}
	removeHopByHop(req.Header)
	req.Close = true // one request per upstream connection
	req.RequestURI = ""
	if err := req.Write(idleUp); err != nil {
		writeError(conn, http.StatusBadGateway, "", "sending the request upstream: "+err.Error())
		return
	}
	upLimit := &headerLimit{r: idleUp}
	upr := bufio.NewReaderSize(upLimit, 4096)
	for {
		upLimit.reset(p.cfg.MaxHeaderBytes)
		resp, err := http.ReadResponse(upr, req)
		upLimit.lift()
		if err != nil {
			writeError(conn, http.StatusBadGateway, "", "reading the upstream response: "+err.Error())
			return
		}
		// An interim 1xx (100 Continue) is relayed and the final one follows.
		interim := resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols
		removeHopByHop(resp.Header)
		resp.Close = !interim
		err = resp.Write(idleClient)
		resp.Body.Close()
		if err != nil || !interim {
			return // no keep-alive: the client connection ends here
		}
	}
}

// hopByHop are the headers that concern one connection, not the message.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// writeError answers the client with a short text response and
// "Connection: close".
func writeError(w io.Writer, status int, blocked, message string) {
	body := message + "\n"
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	if blocked != "" {
		fmt.Fprintf(&b, "%s: %s\r\n", guesthost.EgressRefusalHeader, blocked)
	}
	fmt.Fprintf(&b, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	_, _ = io.WriteString(w, b.String())
}

// headerLimit fails reads once remaining bytes were read, until lift. The
// bufio.Reader above it may read ahead up to its size, so the effective
// limit is remaining plus at most one buffer.
type headerLimit struct {
	r         io.Reader
	remaining int
	lifted    bool
	exceeded  bool
}

var errHeaderTooLarge = errors.New("request header too large")

func (h *headerLimit) Read(b []byte) (int, error) {
	if h.lifted {
		return h.r.Read(b)
	}
	if h.remaining <= 0 {
		h.exceeded = true
		return 0, errHeaderTooLarge
	}
	if len(b) > h.remaining {
		b = b[:h.remaining]
	}
	n, err := h.r.Read(b)
	h.remaining -= n
	return n, err
}

func (h *headerLimit) lift() { h.lifted = true }

func (h *headerLimit) reset(n int) { h.remaining, h.lifted, h.exceeded = n, false, false }

// idleConn refreshes the deadline before every read and write.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(b []byte) (int, error) {
	_ = c.Conn.SetDeadline(time.Now().Add(c.idle))
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	_ = c.Conn.SetDeadline(time.Now().Add(c.idle))
	return c.Conn.Write(b)
}
