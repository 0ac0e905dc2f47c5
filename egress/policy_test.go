package egress

import (
	"testing"

	"github.com/stretchr/testify/require"
)

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
		{"garbage entries fail closed", []string{"*", "*.", "exa mple.com", "-bad.com", "a..b", "*.*.com"}, []check{
			{"example.com", false}, {"bad.com", false}, {"a.com", false},
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
	require.Equal(t, []string{"*", "*.", "exa mple.com", "-bad.com", "a..b", "*.*.com"},
		ParsePolicy([]string{"*", "*.", "exa mple.com", "-bad.com", "a..b", "*.*.com"}).Ignored())
	require.False(t, Policy{}.Allows("example.com"), "the zero policy refuses")
	require.True(t, AllowAll().AllowsAll())
}
