package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/egress/splice"
	"github.com/cowork-vmm/cowork-vmm/internal/acceptloop"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// Defaults of Config's limits.
const (
	DefaultMaxConns         = 256
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultDialTimeout      = 15 * time.Second
	DefaultIdleTimeout      = 10 * time.Minute
)

// Resolver resolves a host name; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer opens TCP connections; *net.Dialer implements it.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config configures a Server. Only Lookup is required.
type Config struct {
	// Lookup returns the policy of a spawn if its token is right
	// (Registry.Lookup). Unknown spawns are refused.
	Lookup func(spawnID, token string) (Policy, bool)
	// Resolver defaults to net.DefaultResolver. Tests inject one that maps
	// test names to 127.0.0.1.
	Resolver Resolver
	// Dialer defaults to a net.Dialer.
	Dialer Dialer
	// AllowAddr, when set, replaces the whole address filter: it alone says
	// whether a resolved (or literal) address may be dialled. Tests and the
	// helper's test mode allow loopback with it. The default filter (see
	// addrfilter.go) refuses the host's loopback, 0.0.0.0/8, link-local,
	// multicast and broadcast addresses and every address of the host's own
	// interfaces, and the private ranges unless AllowPrivate.
	AllowAddr func(netip.Addr) bool
	// AllowPrivate lets the default filter dial the private ranges
	// (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7, fec0::/10): the
	// LAN, a VPN, a corporate network. The helper sets it from
	// AllowPrivateEnv. It never opens the host's own addresses.
	AllowPrivate bool
	// HostAddrs lists the host's own addresses for the default filter;
	// default: the kernel's interface addresses, read at each dial. Tests
	// inject one.
	HostAddrs func() ([]netip.Addr, error)
	// UpstreamProxy, when not nil, carries the connections its NO_PROXY
	// does not exclude (the host's proxy setting, UpstreamProxyFromEnv).
	UpstreamProxy *UpstreamProxy
	Logger        *slog.Logger
	// MaxConns bounds concurrent connections (handshaking or spliced);
	// beyond it a connection is refused at once.
	MaxConns         int
	HandshakeTimeout time.Duration // reading the request frame
	DialTimeout      time.Duration // resolving and connecting
	IdleTimeout      time.Duration // a spliced pair with no traffic either way
}

// Server serves egress connections from the guest proxy (one
// protocol.EgressRequest per connection, see protocol/egress.go).
type Server struct {
	cfg    Config
	log    *slog.Logger
	slots  chan struct{}
	filter addrFilter
	// guestLog carries the refusals and bad requests a guest can cause,
	// rate-limited.
	guestLog *ratelog.Logger
	// ctx ends with Close, cutting short resolutions and dials.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	listeners map[net.Listener]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// NewServer returns a server; cfg.Lookup must be set.
func NewServer(cfg Config) *Server {
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{KeepAlive: 30 * time.Second}
	}
	if cfg.HostAddrs == nil {
		cfg.HostAddrs = hostInterfaceAddrs
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Lookup == nil {
		cfg.Lookup = func(string, string) (Policy, bool) { return Policy{}, false }
	}
	if p := cfg.UpstreamProxy; p != nil {
		if p.Err() != nil {
			cfg.Logger.Warn("egress: the host's proxy setting is unusable; connections it would carry fail", "proxy", p, "err", p.Err())
		} else {
			cfg.Logger.Info("egress goes through the host's proxy", "proxy", p)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		ctx:       ctx,
		cancel:    cancel,
		cfg:       cfg,
		log:       cfg.Logger,
		slots:     make(chan struct{}, cfg.MaxConns),
		filter:    addrFilter{custom: cfg.AllowAddr, allowPrivate: cfg.AllowPrivate, hostAddrs: cfg.HostAddrs},
		guestLog:  ratelog.New(cfg.Logger, nil),
		conns:     map[net.Conn]struct{}{},
		listeners: map[net.Listener]struct{}{},
	}
}

// Serve accepts connections from l until l fails or Close is called (or
// ctx ends), and handles each in its own goroutine. A transient accept
// failure (EMFILE, ENFILE, ECONNABORTED…) is logged, rate-limited, and
// retried after a backoff (acceptloop.Serve). It returns nil after Close,
// after ctx ends or once l is closed.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	err := acceptloop.Serve(ctx, l, acceptloop.Config{Log: s.log}, func(conn net.Conn) {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.HandleConn(ctx, conn)
		}()
	})
	if err == nil || s.isClosed() || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("egress: accepting a guest connection: %w", err)
}

// HandleConn serves one connection and closes it. It returns when the
// connection ends (after splicing, for an allowed target).
func (s *Server) HandleConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		s.guestLog.Warn("egress refused: too many connections", "limit", s.cfg.MaxConns)
		_ = protocol.WriteEgressReply(conn, protocol.EgressReply{Error: fmt.Sprintf("the helper already carries %d connections for this guest; try again later", s.cfg.MaxConns)})
		return
	}
	if !s.track(conn) {
		return
	}
	defer s.untrack(conn)

	_ = conn.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	req, err := protocol.ReadEgressRequest(conn)
	if err != nil {
		s.guestLog.Warn("egress: bad request from the guest", "err", err)
		if errors.Is(err, protocol.ErrEgressFrame) {
			_ = protocol.WriteEgressReply(conn, protocol.EgressReply{Error: err.Error()})
		}
		return
	}
	// The dial has its own timeout; the reply must not inherit the
	// request's deadline.
	_ = conn.SetDeadline(time.Time{})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	upstream, rep := s.open(ctx, req)
	_ = conn.SetWriteDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	if err := protocol.WriteEgressReply(conn, rep); err != nil || !rep.OK {
		if upstream != nil {
			upstream.Close()
		}
		return
	}
	_ = conn.SetDeadline(time.Time{})
	s.log.Debug("egress connected", "spawn", req.SpawnID, "host", req.Host, "port", req.Port)
	splice.Pair(conn, nil, upstream, s.cfg.IdleTimeout)
}

// open checks the policy and dials; on refusal it returns the reply only.
func (s *Server) open(ctx context.Context, req protocol.EgressRequest) (net.Conn, protocol.EgressReply) {
	policy, ok := s.cfg.Lookup(req.SpawnID, req.Token)
	if !ok {
		s.guestLog.Warn("egress refused: unknown spawn or wrong token", "spawn", req.SpawnID, "host", req.Host)
		return nil, protocol.EgressReply{Error: fmt.Sprintf("spawn %q has no egress registered (it ended, or the token is wrong)", req.SpawnID)}
	}
	if !policy.AllowsPort(req.Host, req.Port) {
		s.guestLog.Warn("egress blocked by allowedDomains", "spawn", req.SpawnID, "host", req.Host, "port", req.Port)
		return nil, protocol.EgressReply{Blocked: true, Error: guesthost.EgressBlockedByAllowlist + ": " + req.Host}
	}
	conn, err := s.dial(ctx, req.Host, req.Port)
	if err != nil {
		msg := "egress dial failed"
		if isAddrRefused(err) {
			msg = "egress refused by the address filter"
		}
		s.guestLog.Warn(msg, "spawn", req.SpawnID, "host", req.Host, "port", req.Port, "err", err)
		return nil, protocol.EgressReply{Error: err.Error()}
	}
	return conn, protocol.EgressReply{OK: true}
}

// DialContext dials like a guest connection would, without a spawn policy
// but with the address filter and the upstream proxy: the helper's own
// apiReachability probe
// uses it so that it takes the guest's path out
// (http.Transport{DialContext: srv.DialContext}).
func (s *Server) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if network != "tcp" && network != "tcp4" && network != "tcp6" {
		return nil, fmt.Errorf("egress: only TCP is carried, not %s", network)
	}
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("egress: bad port in %q", address)
	}
	return s.dial(ctx, host, port)
}

// dial connects to host:port for the guest: through the upstream proxy
// when it carries host, else by resolving host (unless it is an IP literal),
// dropping the addresses the filter refuses and trying the rest in order
// until one connects.
func (s *Server) dial(ctx context.Context, host string, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	literal, isLiteral := parseIPLiteral(host)
	name := normaliseName(host)
	if !isLiteral && !validHostName(name) {
		return nil, fmt.Errorf("%q is not a valid host name", host)
	}
	if s.cfg.UpstreamProxy.route(host, port) {
		target := name
		if isLiteral {
			if _, err := s.allowedAddrs(host, []netip.Addr{literal}); err != nil {
				return nil, err
			}
			target = literal.String()
		} else if isLocalhostName(name) {
			return nil, &AddrRefusedError{Host: host, Refused: []RefusedAddr{{netip.AddrFrom4([4]byte{127, 0, 0, 1}), "loopback (what localhost names mean, RFC 6761)"}}}
		}
		return s.cfg.UpstreamProxy.connect(ctx, s.cfg.Dialer, target, port)
	}
	addrs := []netip.Addr{literal}
	if !isLiteral {
		found, err := s.cfg.Resolver.LookupNetIP(ctx, "ip", name)
		if err != nil {
			return nil, fmt.Errorf("resolving %s: %w", host, err)
		}
		addrs = found
	}
	allowed, err := s.allowedAddrs(host, addrs)
	if err != nil {
		return nil, err
	}
	var lastErr error
	for _, addr := range allowed {
		conn, err := s.cfg.Dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(addr, uint16(port)).String())
		if err == nil {
			return conn, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("connecting to %s port %d: %w", host, port, lastErr)
}

// allowedAddrs keeps the addresses of host the filter lets the guest reach;
// none is an *AddrRefusedError.
func (s *Server) allowedAddrs(host string, addrs []netip.Addr) ([]netip.Addr, error) {
	allowed, refused, err := s.filter.split(addrs)
	if err != nil {
		return nil, err
	}
	if len(allowed) == 0 {
		return nil, &AddrRefusedError{Host: host, Refused: refused, PrivateAllowed: s.filter.allowPrivate}
	}
	if len(refused) > 0 {
		s.log.Debug("egress: skipping addresses the guest may not reach", "host", host, "refused", refused)
	}
	return allowed, nil
}

// Close closes the listeners given to Serve, ends every connection, waits
// for Serve's handlers, and makes later connections fail.
func (s *Server) Close() error {
	s.cancel()
	s.mu.Lock()
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}
