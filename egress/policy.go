package egress

import (
	"net/netip"
	"strings"
)

// Policy is one spawn's allowedDomains. The zero value refuses everything;
// AllowAll() is the policy of a spawn without allowedDomains.
type Policy struct {
	allowAll  bool
	exact     map[string]bool     // normalised host names
	suffixes  []string            // ".example.com" for "*.example.com"
	addresses map[netip.Addr]bool // IP literals listed as such
	ignored   []string
}

// AllowAll is the policy of a spawn whose allowedDomains is absent.
func AllowAll() Policy { return Policy{allowAll: true} }

// ParsePolicy builds the policy of allowedDomains: nil (absent) allows every
// host; a non-nil list, even empty, allows only its entries. An entry is a
// host name ("api.example.com"), a wildcard ("*.example.com": any name below
// example.com, not example.com itself) or an IP literal ("192.0.2.1",
// "2001:db8::1" or "[2001:db8::1]"). Case and one trailing dot do not
// matter. Entries that are none of these are ignored (they can never match)
// and listed by Ignored, so that a typo fails closed.
func ParsePolicy(allowedDomains []string) Policy {
	if allowedDomains == nil {
		return AllowAll()
	}
	p := Policy{exact: map[string]bool{}, addresses: map[netip.Addr]bool{}}
	for _, entry := range allowedDomains {
		if addr, ok := parseIPLiteral(entry); ok {
			p.addresses[addr] = true
			continue
		}
		name := normaliseName(entry)
		if rest, ok := strings.CutPrefix(name, "*."); ok {
			if validHostName(rest) {
				p.suffixes = append(p.suffixes, "."+rest)
				continue
			}
		} else if validHostName(name) {
			p.exact[name] = true
			continue
		}
		p.ignored = append(p.ignored, entry)
	}
	return p
}

// AllowsAll reports whether the policy has no restriction.
func (p Policy) AllowsAll() bool { return p.allowAll }

// Ignored lists the allowedDomains entries that were not understood.
func (p Policy) Ignored() []string { return p.ignored }

// Allows reports whether host (a name or an IP literal, as a client put it
// in CONNECT or a URL) may be reached. An IP literal is allowed only if
// listed as one; a name never matches an IP entry or vice versa.
func (p Policy) Allows(host string) bool {
	if p.allowAll {
		return true
	}
	if addr, ok := parseIPLiteral(host); ok {
		return p.addresses[addr]
	}
	name := normaliseName(host)
	if !validHostName(name) {
		return false
	}
	if p.exact[name] {
		return true
	}
	for _, suffix := range p.suffixes {
		// The suffix starts with a dot: "evil-example.com" does not end with
		// ".example.com", and the bare "example.com" is not matched either.
		if len(name) > len(suffix) && strings.HasSuffix(name, suffix) {
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
