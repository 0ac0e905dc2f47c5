package agent

import (
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/guest/proxy/netns"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// refusingDialer stands in for the helper's egress service: it records each
// request and refuses it as blocked.
type refusingDialer struct {
	mu       sync.Mutex
	requests []protocol.EgressRequest
}

func (d *refusingDialer) DialHost(context.Context) (net.Conn, error) {
	proxySide, helperSide := net.Pipe()
	go d.refuse(helperSide)
	return proxySide, nil
}

// refuse serves one connection from a proxy as the helper would: it reads
// the request, records it, and refuses it as blocked.
func (d *refusingDialer) refuse(helperSide net.Conn) {
	defer helperSide.Close()
	req, err := protocol.ReadEgressRequest(helperSide)
	if err != nil {
		return
	}
	d.mu.Lock()
	d.requests = append(d.requests, req)
	d.mu.Unlock()
	_ = protocol.WriteEgressReply(helperSide, protocol.EgressReply{Blocked: true, Error: "blocked-by-allowlist: " + req.Host})
}

// seen returns the requests so far.
func (d *refusingDialer) seen() []protocol.EgressRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.requests)
}

// TestSpawnGetsItsOwnNetworkAndProxy: with Options.Egress, a spawn runs in
// a network namespace of its own, with the proxy variables set, and its
// proxy presents the spawn's id and token to the helper.
func TestSpawnGetsItsOwnNetworkAndProxy(t *testing.T) {
	ns, err := netns.New()
	if err != nil {
		t.Skipf("cannot create network namespaces here: %v", err)
	}
	ns.Close()
	dialer := &refusingDialer{}
	c := startAgent(t, Options{Egress: dialer})
	ownNet, err := os.Readlink("/proc/self/ns/net")
	require.NoError(t, err)

	require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "net", Command: "sh", Cwd: "/", Env: []string{"PATH=/usr/bin:/bin", "HTTP_PROXY=http://evil:1"}, EgressToken: "tok-1",
		Args: []string{"-c", `readlink /proc/self/ns/net; echo "$HTTPS_PROXY|$HTTP_PROXY|$http_proxy|$NO_PROXY"; cat /proc/net/dev | tail -n +3 | cut -d: -f1`},
	}, nil))
	p := c.WaitExit("net")
	lines := withoutFallbackTunnels(strings.Split(strings.TrimSpace(p.Stdout.String()), "\n"))
	require.Len(t, lines, 3, p.Stdout.String()+p.Stderr.String())
	require.NotEqual(t, ownNet, lines[0], "the spawn has a network namespace of its own")
	vars := strings.Split(lines[1], "|")
	require.True(t, strings.HasPrefix(vars[0], "http://127.0.0.1:"), lines[1])
	require.Equal(t, []string{vars[0], vars[0], "localhost,127.0.0.1"}, vars[1:], "the proxy replaces the spawn's own proxy settings")
	require.Equal(t, "lo", strings.TrimSpace(lines[2]), "only loopback")

	if _, err := os.Stat("/usr/bin/curl"); err != nil {
		t.Skip("no curl to make a request through the proxy")
	}
	require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "req", Command: "/usr/bin/curl", Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}, EgressToken: "tok-2",
		Args: []string{"-sS", "-i", "--max-time", "20", "http://somewhere.test/"},
	}, nil))
	p = c.WaitExit("req")
	require.Contains(t, p.Stdout.String(), "403", p.Stderr.String())
	require.Contains(t, p.Stdout.String(), "X-Cowork-Egress: blocked-by-allowlist")
	dialer.mu.Lock()
	defer dialer.mu.Unlock()
	require.Equal(t, []protocol.EgressRequest{{SpawnID: "req", Token: "tok-2", Host: "somewhere.test", Port: 80}}, dialer.requests)
}

// withoutFallbackTunnels drops the network devices a kernel with IPv6
// tunnels built in (CONFIG_IPV6_SIT=y, ours among them) puts in every new
// network namespace, down and routeless: they reach nothing.
func withoutFallbackTunnels(lines []string) []string {
	var kept []string
	for _, l := range lines {
		switch strings.TrimSpace(l) {
		case "sit0", "ip6tnl0", "tunl0":
			continue
		}
		kept = append(kept, l)
	}
	return kept
}
