package egress

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Policy is one spawn's allowedDomains. The zero value refuses everything;
// AllowAll() is the policy of a spawn without allowedDomains.
type Policy struct {
	allowAll  bool
	anyHost   []int                // ports of "*:port" entries
	exact     map[string][]int     // normalised host name → ports (0: any)
	addresses map[netip.Addr][]int // IP literals listed as such → ports
	domains   []domainRule         // "*.example.com" and ".example.com"
	ignored   []string
}

// domainRule is a "*.suffix" or ".suffix" entry.
type domainRule struct {
	suffix string // ".example.com"
	apex   bool   // the ".example.com" form: example.com itself too
	port   int    // 0: any
}

// AllowAll is the policy of a spawn whose allowedDomains is absent.
func AllowAll() Policy { return Policy{allowAll: true} }

// ParsePolicy builds the policy of allowedDomains: nil (absent) allows every
// host; a non-nil list, even empty, allows only its entries. An entry is
//
//   - "*": every host (as if allowedDomains were absent);
//   - a host name, "api.example.com": that name only;
//   - "*.example.com": any name below example.com, not example.com itself;
//   - ".example.com": example.com and any name below it. This is what a
//     leading dot means in curl's NO_PROXY (and Python's): "*.example.com"
//     plus the apex. (Go's own NO_PROXY parser reads it as the subdomains
//     only; the apex is what people who write the dot expect, and writing
//     "*.example.com" says "subdomains only" without ambiguity.)
//   - an IP literal, "192.0.2.1", "2001:db8::1" or "[2001:db8::1]";
//   - any of these but "*" alone followed by ":port", "example.com:8443",
//     "*.example.com:443", "[2001:db8::1]:443", "*:443": that host on that
//     port only (an IPv6 literal takes brackets before a port).
//
// Case and one trailing dot do not matter. Entries that are none of these
// are ignored (they can never match) and listed by Ignored, so that a typo
// fails closed.
func ParsePolicy(allowedDomains []string) Policy {
	if allowedDomains == nil {
		return AllowAll()
	}
	p := Policy{exact: map[string][]int{}, addresses: map[netip.Addr][]int{}}
	for _, entry := range allowedDomains {
		if !p.add(entry) {
			p.ignored = append(p.ignored, entry)
		}
	}
	return p
}

// add records one allowedDomains entry; false if it is not understood.
func (p *Policy) add(entry string) bool {
	s := strings.TrimSpace(entry)
	if addr, ok := parseIPLiteral(s); ok {
		p.addresses[addr] = append(p.addresses[addr], 0)
		return true
	}
	port := 0
	if host, portText, err := net.SplitHostPort(s); err == nil {
		if port = parsePort(portText); port == 0 {
			return false
		}
		if addr, ok := parseIPLiteral(host); ok {
			p.addresses[addr] = append(p.addresses[addr], port)
			return true
		}
		if strings.HasPrefix(s, "[") {
			return false // brackets hold IPv6 literals only
		}
		s = host
	}
	if s == "*" { // before normaliseName, which would make "*." a "*"
		if port == 0 {
			p.allowAll = true
		} else {
			p.anyHost = append(p.anyHost, port)
		}
		return true
	}
	name := normaliseName(s)
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		if !validHostName(rest) {
			return false
		}
		p.domains = append(p.domains, domainRule{suffix: "." + rest, port: port})
		return true
	}
	if rest, ok := strings.CutPrefix(name, "."); ok {
		if !validHostName(rest) {
			return false
		}
		p.domains = append(p.domains, domainRule{suffix: name, apex: true, port: port})
		return true
	}
	if !validHostName(name) {
		return false
	}
	p.exact[name] = append(p.exact[name], port)
	return true
}

// parsePort reads a decimal port of 1..65535; 0 means it is not one.
func parsePort(s string) int {
	if !allDigits(s) || len(s) > 5 {
		return 0
	}
	n, _ := strconv.Atoi(s)
	if n > 65535 {
		return 0
	}
	return n
}

// AllowsAll reports whether the policy has no restriction.
func (p Policy) AllowsAll() bool { return p.allowAll }

// Ignored lists the allowedDomains entries that were not understood.
func (p Policy) Ignored() []string { return p.ignored }

// Allows reports whether host may be reached on every port: only entries
// without a port count. The server asks AllowsPort.
func (p Policy) Allows(host string) bool { return p.AllowsPort(host, 0) }

// AllowsPort reports whether host (a name or an IP literal, as a client put
// it in CONNECT or a URL) may be reached on port; port 0 asks about every
// port. An IP literal is allowed only if listed as one; a name never
// matches an IP entry or vice versa.
func (p Policy) AllowsPort(host string, port int) bool {
	if p.allowAll || portListed(p.anyHost, port) {
		return true
	}
	if addr, ok := parseIPLiteral(host); ok {
		return portListed(p.addresses[addr], port)
	}
	name := normaliseName(host)
	if !validHostName(name) {
		return false
	}
	if portListed(p.exact[name], port) {
		return true
	}
	for _, d := range p.domains {
		if d.port != 0 && d.port != port {
			continue
		}
		// The suffix starts with a dot: "evil-example.com" does not end with
		// ".example.com"; the bare "example.com" only matches the apex form.
		if len(name) > len(d.suffix) && strings.HasSuffix(name, d.suffix) || d.apex && name == d.suffix[1:] {
			return true
		}
	}
	return false
}

// portListed reports whether ports holds 0 (any port) or port.
func portListed(ports []int, port int) bool {
	for _, p := range ports {
		if p == 0 || p == port {
			return true
		}
	}
	return false
}

// normaliseName lower-cases and drops one trailing dot.
func normaliseName(s string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
}

// parseIPLiteral accepts "1.2.3.4", "::1" and "[::1]"; zones are refused.
// IPv4-mapped IPv6 addresses compare as their IPv4 form.
func parseIPLiteral(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
	}
	addr, err := netip.ParseAddr(s)
	if err != nil || addr.Zone() != "" {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// validHostName accepts LDH names (plus '_', which real DNS names carry) of
// at most 253 bytes, labels of 1..63 bytes not starting or ending with '-'.
// A name whose last label is all digits, or that looks like a hex number, is
// refused: C resolvers (inet_aton) read "2130706433", "127.1" or
// "0x7f000001" as IP addresses, which would slip past the IP-literal rule.
func validHostName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	labels := strings.Split(name, ".")
	for _, label := range labels {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	if allDigits(last) {
		return false
	}
	for _, label := range labels {
		if looksNumeric(label) {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// looksNumeric: "0x1f"-style labels, which inet_aton parses as numbers.
func looksNumeric(label string) bool {
	rest, ok := strings.CutPrefix(label, "0x")
	if !ok {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
