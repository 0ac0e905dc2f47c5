package probe

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Route flags of /proc/net/route and /proc/net/ipv6_route (linux/route.h).
const (
	rtfUp     = 0x0001
	rtfReject = 0x0200
)

// DefaultResolveName is resolved to decide whether names resolve.
const DefaultResolveName = "api.anthropic.com"

// Resolver resolves names; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// NetworkChecker decides networkStatus. The zero value reads /proc/net and
// resolves DefaultResolveName with net.DefaultResolver.
type NetworkChecker struct {
	ProcNetDir string   // default "/proc/net"; tests point it at fixtures
	Resolver   Resolver // default net.DefaultResolver
	Name       string   // default DefaultResolveName (use apiProbeURL's host)
}

// NetworkStatus is NetworkChecker{}.Status.
func NetworkStatus(ctx context.Context) string { return NetworkChecker{}.Status(ctx) }

// Status is protocol.NetworkConnected when a default route exists (IPv4 or
// IPv6, up, not a reject route, not on lo) and Name resolves; otherwise
// protocol.NetworkNotConnected.
func (c NetworkChecker) Status(ctx context.Context) string {
	dir := c.ProcNetDir
	if dir == "" {
		dir = "/proc/net"
	}
	if !hasDefaultRoute(dir) {
		return protocol.NetworkNotConnected
	}
	resolver := c.Resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	name := c.Name
	if name == "" {
		name = DefaultResolveName
	}
	addrs, err := resolver.LookupNetIP(ctx, "ip", name)
	if err != nil || len(addrs) == 0 {
		return protocol.NetworkNotConnected
	}
	return protocol.NetworkConnected
}

func hasDefaultRoute(dir string) bool {
	for _, f := range []struct {
		name  string
		parse func(io.Reader) bool
	}{{"route", DefaultRouteIPv4}, {"ipv6_route", DefaultRouteIPv6}} {
		file, err := os.Open(filepath.Join(dir, f.name))
		if err != nil {
			continue
		}
		found := f.parse(file)
		file.Close()
		if found {
			return true
		}
	}
	return false
}

// DefaultRouteIPv4 reports whether a /proc/net/route table has a usable
// default route.
func DefaultRouteIPv4(r io.Reader) bool {
	sc := bufio.NewScanner(r)
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[0] == "lo" {
			continue
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err != nil || flags&rtfUp == 0 || flags&rtfReject != 0 {
			continue
		}
		if f[1] == "00000000" && f[7] == "00000000" {
			return true
		}
	}
	return false
}

// DefaultRouteIPv6 reports whether a /proc/net/ipv6_route table has a
// usable default route (::/0 that is up, not a reject route, not on lo).
func DefaultRouteIPv6(r io.Reader) bool {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[9] == "lo" {
			continue
		}
		if f[0] != strings.Repeat("0", 32) || f[1] != "00" {
			continue
		}
		flags, err := strconv.ParseUint(f[8], 16, 32)
		if err != nil || flags&rtfUp == 0 || flags&rtfReject != 0 {
			continue
		}
		return true
	}
	return false
}
