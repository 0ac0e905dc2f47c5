package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// The address filter: which resolved (or literal) addresses the helper may
// dial for the guest. A policy names hosts; whatever a name resolves to, the
// guest must never reach the host itself (its loopback, 0.0.0.0, which
// Linux connects to the host, and every address of its own interfaces — a
// LAN or bridge address reaches the host's services as surely as 127.0.0.1),
// its link (169.254.169.254 is the cloud metadata service), nor, unless
// Config.AllowPrivate, the private networks around it. Every check runs on
// the unmapped address, so ::ffff:127.0.0.1 is 127.0.0.1.

// AllowPrivateEnv is the helper's environment variable that sets
// Config.AllowPrivate when it is "1".
const AllowPrivateEnv = "COWORK_VMM_EGRESS_ALLOW_PRIVATE"

type addrRange struct {
	prefix netip.Prefix
	what   string
}

func ranges(spec ...string) []addrRange {
	out := make([]addrRange, 0, len(spec)/2)
	for i := 0; i < len(spec); i += 2 {
		out = append(out, addrRange{netip.MustParsePrefix(spec[i]), spec[i+1]})
	}
	return out
}

// neverReached are refused whatever the configuration.
var neverReached = ranges(
	"0.0.0.0/8", `"this network" (Linux connects 0.0.0.0 to the host itself)`,
	"127.0.0.0/8", "loopback",
	"169.254.0.0/16", "link-local (the cloud metadata service lives there)",
	"224.0.0.0/4", "multicast",
	"255.255.255.255/32", "broadcast",
	"::/128", "unspecified",
	"::1/128", "loopback",
	"::/96", "IPv4-compatible (deprecated)",
	"fe80::/10", "link-local",
	"ff00::/8", "multicast",
)

// privateRanges are refused unless Config.AllowPrivate.
var privateRanges = ranges(
	"10.0.0.0/8", "private",
	"172.16.0.0/12", "private",
	"192.168.0.0/16", "private",
	"100.64.0.0/10", "shared address space (carrier-grade NAT)",
	"fc00::/7", "unique local",
	"fec0::/10", "site-local (deprecated)",
)

// nat64 is the well-known NAT64 prefix (RFC 6052): its last 32 bits are the
// IPv4 address a translator connects to, which is checked as such.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// DefaultAllowAddr reports whether a is outside every range the default
// filter refuses: the host's loopback, 0.0.0.0/8, link-local, multicast,
// broadcast and the private ranges. The server's default filter also
// refuses the host's own interface addresses, which takes a live read.
func DefaultAllowAddr(a netip.Addr) bool { return rangeRefusal(a, false) == "" }

// rangeRefusal says why a falls in a refused range, or "" if it does not.
func rangeRefusal(a netip.Addr, allowPrivate bool) string {
	a = a.Unmap().WithZone("")
	if !a.IsValid() {
		return "not an address"
	}
	if nat64.Contains(a) {
		raw := a.As16()
		v4 := netip.AddrFrom4([4]byte(raw[12:]))
		if why := rangeRefusal(v4, allowPrivate); why != "" {
			return "NAT64 of " + v4.String() + ": " + why
		}
		return ""
	}
	list := [][]addrRange{neverReached}
	if !allowPrivate {
		list = append(list, privateRanges)
	}
	for _, rs := range list {
		for _, r := range rs {
			if r.prefix.Contains(a) {
				return r.what + " (" + r.prefix.String() + ")"
			}
		}
	}
	return ""
}

// The host's own addresses are read from the kernel on every dial that gets
// this far (net.InterfaceAddrs: one netlink dump, about 30 µs, small next to
// the resolution and the TCP handshake of the same dial). It is the simplest
// correct choice: nothing can be stale, so an address that appears (a DHCP
// lease, a VPN, a new bridge) is refused from the first dial after it, with
// no cache window, no goroutine and no netlink subscription to keep alive or
// resynchronise after an overflow.
func hostInterfaceAddrs() ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(ifAddrs))
	for _, ia := range ifAddrs {
		if n, ok := ia.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out, nil
}

// addrFilter is the server's filter: Config.AllowAddr when set (tests, the
// helper's test mode), else the ranges above plus the host's addresses.
type addrFilter struct {
	custom       func(netip.Addr) bool
	allowPrivate bool
	hostAddrs    func() ([]netip.Addr, error)
}

// RefusedAddr is one address the filter refused, and why.
type RefusedAddr struct {
	Addr netip.Addr
	Why  string
}

// split keeps the addresses of addrs the guest may reach, in order, and
// says why each other one was refused. It fails (closed) when the host's
// addresses cannot be read.
func (f addrFilter) split(addrs []netip.Addr) (allowed []netip.Addr, refused []RefusedAddr, err error) {
	var own []netip.Addr
	ownRead := false
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		why := ""
		switch {
		case f.custom != nil:
			if !f.custom(a) {
				why = "refused by the configured filter"
			}
		default:
			if why = rangeRefusal(a, f.allowPrivate); why != "" {
				break
			}
			if !ownRead {
				if own, err = f.hostAddrs(); err != nil {
					return nil, nil, fmt.Errorf("cannot read the host's own addresses, which the guest must not reach: %w", err)
				}
				ownRead = true
			}
			if isHostAddr(own, a) {
				why = "an address of the host itself"
			}
		}
		if why != "" {
			refused = append(refused, RefusedAddr{a, why})
		} else {
			allowed = append(allowed, a)
		}
	}
	return allowed, refused, nil
}

// isHostAddr reports whether a (or, for a NAT64 address, the IPv4 address
// it stands for) is one of own.
func isHostAddr(own []netip.Addr, a netip.Addr) bool {
	if nat64.Contains(a) {
		raw := a.As16()
		a = netip.AddrFrom4([4]byte(raw[12:]))
	}
	for _, o := range own {
		if o.Unmap().WithZone("") == a {
			return true
		}
	}
	return false
}

// AddrRefusedError is a dial refused because every address of the host is
// one the guest may not reach. Its message starts with
// guesthost.EgressBlockedByAddressFilter.
type AddrRefusedError struct {
	Host    string
	Refused []RefusedAddr
	// PrivateAllowed: the filter already lets the private ranges through
	// (Config.AllowPrivate), so the message does not suggest AllowPrivateEnv
	// for a private address refused for another reason (the host's own).
	PrivateAllowed bool
}

// maxRefusedListed bounds the addresses an AddrRefusedError names.
const maxRefusedListed = 4

func (e *AddrRefusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s: the guest may not reach ", guesthost.EgressBlockedByAddressFilter, e.Host)
	private := false
	for i, r := range e.Refused {
		if i == maxRefusedListed {
			fmt.Fprintf(&b, ", and %d more", len(e.Refused)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s, %s", r.Addr, r.Why)
		private = private || rangeRefusal(r.Addr, true) == "" && rangeRefusal(r.Addr, false) != ""
	}
	if private && !e.PrivateAllowed {
		fmt.Fprintf(&b, " (private ranges are reachable only when the helper runs with %s=1)", AllowPrivateEnv)
	}
	return b.String()
}

// isAddrRefused reports whether err is an address-filter refusal.
func isAddrRefused(err error) bool {
	var refused *AddrRefusedError
	return errors.As(err, &refused)
}
