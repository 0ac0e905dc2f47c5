package egress

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// garbage are allowedDomains entries that are none of the accepted forms.
var garbage = []string{
	"*.", ".", "..a.com", "exa mple.com", "-bad.com", "a..b", "*.*.com", "**", "*a.com",
	"a.com:", "a.com:0", "a.com:65536", "a.com:+80", "a.com:http", "a.com:80:80", ":80",
	"[a.com]:80", "[192.0.2.1", "2001:db8::1:", "https://a.com", "a.com/path", "user@a.com",
	"example.org.:x",
}

func TestPolicy(t *testing.T) {
	type check struct {
		host  string
		allow bool
	}
	cases := []struct {
		name    string
		domains []string
		checks  []check
	}{
		{"absent allows all", nil, []check{{"anything.example", true}, {"192.0.2.1", true}}},
		{"empty refuses all", []string{}, []check{{"example.com", false}, {"192.0.2.1", false}}},
		{"exact", []string{"api.example.com"}, []check{
			{"api.example.com", true}, {"example.com", false}, {"x.api.example.com", false}, {"api.example.co", false},
		}},
		{"wildcard", []string{"*.example.com"}, []check{
			{"a.example.com", true}, {"a.b.example.com", true},
			{"example.com", false}, {"evil-example.com", false}, {"a.evil-example.com", false},
			{"example.com.evil.test", false}, {".example.com", false},
		}},
		{"wildcard plus bare", []string{"*.example.com", "example.com"}, []check{
			{"example.com", true}, {"a.example.com", true}, {"evil-example.com", false},
		}},
		{"case and trailing dot", []string{"API.Example.COM."}, []check{
			{"api.example.com", true}, {"API.EXAMPLE.COM", true}, {"api.example.com.", true}, {"api.example.com..", false},
		}},
		{"ip literals only when listed", []string{"example.com", "192.0.2.7", "[2001:db8::1]"}, []check{
			{"192.0.2.7", true}, {"192.0.2.8", false}, {"2001:db8::1", true}, {"[2001:db8::1]", true},
			{"::ffff:192.0.2.7", true}, {"127.0.0.1", false}, {"::1", false},
		}},
		{"numeric names that C resolvers read as IPs", []string{"*.example.com"}, []check{
			{"2130706433", false}, {"127.1", false}, {"0x7f000001", false}, {"0x7f.example.com", false},
		}},
		{"garbage entries fail closed", garbage, []check{
			{"example.com", false}, {"bad.com", false}, {"a.com", false}, {"example.org", false},
		}},
		{"star allows all", []string{"example.com", "*"}, []check{
			{"anything.example", true}, {"192.0.2.1", true}, {"example.com", true},
		}},
		{"dot form is the domain and its subdomains", []string{".Example.COM."}, []check{
			{"example.com", true}, {"a.example.com", true}, {"a.b.example.com", true},
			{"evil-example.com", false}, {"a.evil-example.com", false}, {"example.com.evil.test", false},
			{"xexample.com", false}, {"com", false},
		}},
		{"invalid hosts never match", []string{"*.example.com"}, []check{
			{"a b.example.com", false}, {"a/b.example.com", false}, {"", false}, {"é.example.com", false},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := ParsePolicy(tc.domains)
			for _, c := range tc.checks {
				require.Equal(t, c.allow, p.Allows(c.host), "host %q", c.host)
			}
		})
	}
	require.Equal(t, garbage, ParsePolicy(garbage).Ignored())
	require.Empty(t, ParsePolicy([]string{"*", ".a.com", "a.com:1", "[::1]:2", "*:3", "*.a.com:4"}).Ignored())
	require.False(t, Policy{}.Allows("example.com"), "the zero policy refuses")
	require.True(t, AllowAll().AllowsAll())
}

// TestPolicyPorts: a ":port" suffix limits any host form to that port, and
// Allows (every port) counts only entries without one.
func TestPolicyPorts(t *testing.T) {
	p := ParsePolicy([]string{
		"api.example.com:8443", "api.example.com:9443", "*.svc.test:443", ".dom.test:80",
		"192.0.2.7:22", "[2001:db8::1]:443", "*:853", "free.test",
	})
	type check struct {
		host  string
		port  int
		allow bool
	}
	for _, c := range []check{
		{"api.example.com", 8443, true}, {"API.example.com.", 9443, true}, {"api.example.com", 443, false},
		{"api.example.com", 0, false},
		{"a.svc.test", 443, true}, {"a.svc.test", 80, false}, {"svc.test", 443, false},
		{"dom.test", 80, true}, {"x.dom.test", 80, true}, {"dom.test", 443, false},
		{"192.0.2.7", 22, true}, {"::ffff:192.0.2.7", 22, true}, {"192.0.2.7", 23, false},
		{"2001:db8::1", 443, true}, {"[2001:db8::1]", 443, true}, {"2001:db8::1", 80, false},
		{"anything.test", 853, true}, {"192.0.2.99", 853, true}, {"anything.test", 854, false},
		{"anything.test", 0, false},
		{"free.test", 1, true}, {"free.test", 65535, true}, {"free.test", 0, true},
	} {
		require.Equal(t, c.allow, p.AllowsPort(c.host, c.port), "%s port %d", c.host, c.port)
	}
	require.False(t, p.AllowsAll())
	require.True(t, p.Allows("free.test"))
	require.False(t, p.Allows("api.example.com"), "Allows means every port")
	require.Empty(t, p.Ignored())
}
