package helper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/egress"
	"github.com/cowork-vmm/cowork-vmm/egress/probe"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Network status and API reachability. The guest has no network device: its
// processes reach out only through the helper's egress server, so the
// helper's own view of the network is the guest's, and the apiProbeURL probe
// takes the same path (egress.Server.DialContext).

// apiProbeTimeout bounds one HEAD of apiProbeURL. The client waits for the
// first apiReachability event during start-up, so it must not be long.
const apiProbeTimeout = 5 * time.Second

// EgressTestHostsEnv names the test-only environment variable the helper
// binary reads (cmd/cowork-vmm puts it in Options.EgressTestHosts): a comma
// separated list of name=address pairs, e.g.
//
//	COWORK_VMM_EGRESS_TEST_HOSTS="allowed.test=127.0.0.1,sub.wild.test=127.0.0.1"
//
// When set, the egress server (and the network status check) resolve only
// those names, to those addresses, and may dial only those addresses —
// which must be loopback (127.0.0.0/8 or ::1). It exists so that end-to-end
// tests of the real binary can serve test domains from 127.0.0.1, which the
// production egress server refuses to dial (egress.DefaultAllowAddr), and
// so that those tests never send a DNS query or a connection anywhere else.
// Never set it in production: it replaces real name resolution.
const EgressTestHostsEnv = "COWORK_VMM_EGRESS_TEST_HOSTS"

// testHosts is the parsed EgressTestHostsEnv: a resolver and address filter
// confined to loopback.
type testHosts struct {
	names map[string]netip.Addr
	addrs map[netip.Addr]bool
}

// parseEgressTestHosts parses EgressTestHostsEnv's value.
func parseEgressTestHosts(spec string) (*testHosts, error) {
	th := &testHosts{names: map[string]netip.Addr{}, addrs: map[netip.Addr]bool{}}
	for _, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, addrText, ok := strings.Cut(entry, "=")
		name = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
		if !ok || name == "" {
			return nil, fmt.Errorf("%s: %q is not name=address", EgressTestHostsEnv, entry)
		}
		addr, err := netip.ParseAddr(strings.TrimSpace(addrText))
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", EgressTestHostsEnv, entry, err)
		}
		addr = addr.Unmap()
		if !addr.IsLoopback() || addr.Zone() != "" {
			return nil, fmt.Errorf("%s: %s maps to %s, but test hosts may only be loopback addresses (127.0.0.0/8 or ::1)", EgressTestHostsEnv, name, addr)
		}
		th.names[name] = addr
		th.addrs[addr] = true
	}
	if len(th.names) == 0 {
		return nil, fmt.Errorf("%s is set but names no host", EgressTestHostsEnv)
	}
	return th, nil
}

// LookupNetIP implements egress.Resolver and probe.Resolver: only the test
// names resolve.
func (th *testHosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if addr, ok := th.names[strings.TrimSuffix(strings.ToLower(host), ".")]; ok {
		return []netip.Addr{addr}, nil
	}
	return nil, &net.DNSError{Err: "not one of the " + EgressTestHostsEnv + " names", Name: host, IsNotFound: true}
}

// allowAddr permits exactly the test addresses.
func (th *testHosts) allowAddr(a netip.Addr) bool { return th.addrs[a.Unmap()] }

// newEgressServer makes a profile's egress server for opts, confined to
// th when the test hosts are set.
func newEgressServer(opts Options, th *testHosts, reg *egress.Registry, log *slog.Logger) *egress.Server {
	cfg := egress.Config{Lookup: reg.Lookup, Logger: log.With("component", "egress"),
		AllowPrivate: opts.EgressAllowPrivate, UpstreamProxy: opts.EgressProxy}
	if th != nil {
		cfg.Resolver = th
		cfg.AllowAddr = th.allowAddr
		cfg.UpstreamProxy = nil // test names are served on loopback, never by a proxy
	}
	return egress.NewServer(cfg)
}

// serveEgress serves a guest's egress connections (Guest.Egress) until ctx
// (the guest's life) ends. A guest without an egress listener is refused:
// its processes would have no network at all.
func (s *Service) serveEgress(ctx context.Context, g Guest) error {
	l := g.Egress()
	if l == nil {
		return errors.New("the backend gave the guest no egress channel: its processes could not reach the network")
	}
	go func() {
		if err := s.egressSrv.Serve(ctx, l); err != nil && !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
			s.log.Warn("egress: the guest's egress channel failed; its processes lost the network", "err", err)
		}
	}()
	return nil
}

// monitorNetwork publishes networkStatus at once and on change, and
// apiReachability on the first probe of probeURL and on change (probed every
// 30 s through the egress path; without a URL one "unknown"), until ctx
// (the guest's life) ends.
func (s *Service) monitorNetwork(ctx context.Context, probeURL string) {
	check := s.opts.NetworkCheck
	if check == nil {
		checker := probe.NetworkChecker{}
		if u, err := url.Parse(probeURL); err == nil && u.Hostname() != "" {
			checker.Name = u.Hostname()
		}
		if s.testHosts != nil {
			checker.Resolver = s.testHosts
		}
		check = checker.Status
	}
	client := s.opts.ProbeClient
	if client == nil {
		client = probe.NewHTTPClient(s.egressSrv.DialContext)
	}
	network := &probe.NetworkMonitor{Check: check, Emit: func(ev protocol.Event) {
		s.log.Info("network status", "status", ev.Status)
		s.hub.Publish(ev)
	}}
	reach := &probe.Monitor{ProbeURL: probeURL, Client: client, Timeout: apiProbeTimeout, Emit: func(ev protocol.Event) {
		s.log.Info("API reachability", "status", ev.Status, "url", probeURL)
		s.hub.Publish(ev)
	}}
	go network.Run(ctx)
	go reach.Run(ctx)
}
