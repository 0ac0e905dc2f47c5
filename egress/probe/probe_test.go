package probe_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/egress"
	"github.com/cowork-vmm/cowork-vmm/egress/probe"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const routeHeader = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"

const (
	ipv4Default  = routeHeader + "eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\neth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
	ipv4LinkOnly = routeHeader + "eth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
	ipv4Down     = routeHeader + "eth0\t00000000\t0101A8C0\t0002\t0\t0\t100\t00000000\t0\t0\t0\n"
	// The kernel's own reject route on lo, present on every host.
	ipv6LoReject = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"
	ipv6Default  = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00450003     eth0\n"
	ipv6Link     = "fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n"
)

func TestDefaultRouteParsing(t *testing.T) {
	require.True(t, probe.DefaultRouteIPv4(strings.NewReader(ipv4Default)))
	require.False(t, probe.DefaultRouteIPv4(strings.NewReader(ipv4LinkOnly)))
	require.False(t, probe.DefaultRouteIPv4(strings.NewReader(ipv4Down)), "a route that is not up does not count")
	require.False(t, probe.DefaultRouteIPv4(strings.NewReader("")))
	require.False(t, probe.DefaultRouteIPv4(strings.NewReader(routeHeader+"lo\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0\n")))
	require.True(t, probe.DefaultRouteIPv6(strings.NewReader(ipv6LoReject+ipv6Default)))
	require.False(t, probe.DefaultRouteIPv6(strings.NewReader(ipv6LoReject+ipv6Link)), "the lo reject route is not a default route")
	require.False(t, probe.DefaultRouteIPv6(strings.NewReader("garbage\n")))
}

type fakeResolver struct{ ok bool }

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if r.ok {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func procNet(t *testing.T, route, ipv6 string) string {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "route"), []byte(route), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ipv6_route"), []byte(ipv6), 0o600))
	return dir
}

func TestNetworkChecker(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		route, ipv6 string
		resolves    bool
		want        string
	}{
		{ipv4Default, ipv6LoReject, true, protocol.NetworkConnected},
		{ipv4LinkOnly, ipv6LoReject + ipv6Default, true, protocol.NetworkConnected},
		{ipv4Default, ipv6LoReject, false, protocol.NetworkNotConnected},
		{ipv4LinkOnly, ipv6LoReject + ipv6Link, true, protocol.NetworkNotConnected},
	}
	for i, tc := range cases {
		c := probe.NetworkChecker{ProcNetDir: procNet(t, tc.route, tc.ipv6), Resolver: fakeResolver{tc.resolves}, Name: "api.test"}
		require.Equal(t, tc.want, c.Status(ctx), "case %d", i)
	}
	c := probe.NetworkChecker{ProcNetDir: t.TempDir(), Resolver: fakeResolver{true}}
	require.Equal(t, protocol.NetworkNotConnected, c.Status(ctx), "no route tables at all")
}

func collect() (func(protocol.Event), <-chan protocol.Event) {
	ch := make(chan protocol.Event, 16)
	return func(e protocol.Event) { ch <- e }, ch
}

// TestMonitorSequence: a target that answers, stops answering and comes
// back, probed through the egress server's dialer (test names → 127.0.0.1).
func TestMonitorSequence(t *testing.T) {
	var down atomic.Bool
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, http.MethodHead, r.Method)
		if down.Load() {
			// Not answering: the connection ends without a response.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable) // any HTTP answer counts
	}))
	defer target.Close()
	port := target.Listener.Addr().(*net.TCPAddr).Port

	srv := egress.NewServer(egress.Config{
		Resolver:  fakeResolver{true},
		AllowAddr: func(a netip.Addr) bool { return a.IsLoopback() },
	})
	defer srv.Close()

	emit, events := collect()
	ticks := make(chan time.Time)
	m := &probe.Monitor{
		ProbeURL: "http://api.test:" + strconv.Itoa(port) + "/",
		Client:   probe.NewHTTPClient(srv.DialContext),
		Emit:     emit,
		Ticks:    ticks,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()

	next := func() string { return (<-events).Status }
	require.Equal(t, protocol.ReachabilityReachable, next(), "first probe")
	down.Store(true) // the first probe ended with its event
	ticks <- time.Time{}
	require.Equal(t, protocol.ReachabilityProbablyUnreachable, next())
	ticks <- time.Time{} // second failure: still probably, no event
	ticks <- time.Time{} // third failure (the send waits for the second to end)
	require.Equal(t, protocol.ReachabilityUnreachable, next())
	// The event is emitted at the end of a probe: no probe is in flight now.
	down.Store(false)
	ticks <- time.Time{}
	require.Equal(t, protocol.ReachabilityReachable, next(), "back")
	cancel()
	<-done
	require.Empty(t, events, "no event without a change")
}

func TestMonitorWithoutURL(t *testing.T) {
	emit, events := collect()
	m := &probe.Monitor{Emit: emit}
	m.Run(context.Background()) // returns at once
	require.Equal(t, protocol.Event{Type: protocol.EventAPIReachability, Status: protocol.ReachabilityUnknown}, <-events)
	require.Empty(t, events)
}

func TestNetworkMonitor(t *testing.T) {
	results := []string{protocol.NetworkConnected, protocol.NetworkConnected, protocol.NetworkNotConnected, protocol.NetworkConnected}
	i := 0
	emit, events := collect()
	n := &probe.NetworkMonitor{Check: func(context.Context) string { s := results[i]; i++; return s }, Emit: emit}
	for range results {
		n.CheckOnce(context.Background())
	}
	var got []string
	for len(events) > 0 {
		e := <-events
		require.Equal(t, protocol.EventNetworkStatus, e.Type)
		got = append(got, e.Status)
	}
	require.Equal(t, []string{protocol.NetworkConnected, protocol.NetworkNotConnected, protocol.NetworkConnected}, got)
}
