package helper

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// answeringProbe answers every apiReachability HEAD without any network.
type answeringProbe struct{}

func (answeringProbe) Do(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

// TestSpawnAllowedDomainsAbsentVersusEmpty: allowedDomains absent allows
// every host, present and empty refuses every host; the agent gets a token
// that the egress registry accepts until the process exits.
func TestSpawnAllowedDomainsAbsentVersusEmpty(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	cases := []struct {
		id       string
		domains  any // nil: the field is left out
		allowAll bool
		allows   string
	}{
		{"absent", nil, true, "anything.example"},
		{"empty", []string{}, false, ""},
		{"listed", []string{"*.example.com"}, false, "api.example.com"},
	}
	for _, c := range cases {
		params := map[string]any{"id": c.id, "name": "s-" + c.id, "command": "/bin/true"}
		if c.domains != nil {
			params["allowedDomains"] = c.domains
		}
		e.spawn(params)
		sp, ok := g.agent.spawned(c.id)
		require.True(t, ok)
		require.NotEmpty(t, sp.EgressToken, c.id)
		policy, ok := e.s.egressReg.Lookup(c.id, sp.EgressToken)
		require.True(t, ok, c.id)
		assert.Equal(t, c.allowAll, policy.AllowsAll(), c.id)
		assert.False(t, policy.Allows("") && !c.allowAll)
		if c.allows != "" {
			assert.True(t, policy.Allows(c.allows), c.id)
		} else {
			assert.False(t, policy.Allows("example.com"), c.id)
		}
		_, ok = e.s.egressReg.Lookup(c.id, "wrong-token")
		assert.False(t, ok, "a wrong token is refused")
	}

	// The exit unregisters the spawn: its token stops working.
	sp, _ := g.agent.spawned("listed")
	e.mustCall("kill", map[string]any{"id": "listed", "signal": "SIGKILL"}, nil)
	e.next(protocol.EventExit)
	_, ok := e.s.egressReg.Lookup("listed", sp.EgressToken)
	assert.False(t, ok, "an exited spawn has no egress")

	// A failed spawn leaves nothing registered.
	g.agent.mu.Lock()
	g.agent.spawnErr = "no such command"
	g.agent.mu.Unlock()
	require.Error(t, e.call("spawn", map[string]any{"id": "failed", "name": "s-failed", "command": "/nope"}, nil))
	sp, _ = g.agent.spawned("failed")
	_, ok = e.s.egressReg.Lookup("failed", sp.EgressToken)
	assert.False(t, ok)
}

func TestParseEgressTestHosts(t *testing.T) {
	th, err := parseEgressTestHosts(" allowed.test=127.0.0.1, Other.Test.=127.0.0.2,v6.test=::1 ")
	require.NoError(t, err)
	addrs, err := th.LookupNetIP(t.Context(), "ip", "other.test")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.2", addrs[0].String())
	_, err = th.LookupNetIP(t.Context(), "ip", "example.com")
	assert.Error(t, err, "only the listed names resolve")
	assert.True(t, th.allowAddr(addrs[0]))
	assert.False(t, th.allowAddr(addrs[0].Next()), "only the listed addresses may be dialled")

	for _, bad := range []string{"", ",", "x.test=10.0.0.1", "x.test=8.8.8.8", "x.test=0.0.0.0", "x.test", "=127.0.0.1", "x.test=fe80::1%lo", "x.test=localhost"} {
		_, err := parseEgressTestHosts(bad)
		assert.Error(t, err, "%q", bad)
	}
	_, err = New(Options{DataDir: t.TempDir(), EgressTestHosts: "x.test=192.168.1.1"})
	require.Error(t, err, "the helper refuses to start with a non-loopback test host")
	assert.Contains(t, err.Error(), EgressTestHostsEnv)
}

// TestEgressThroughGuestListener drives the helper's egress server the way
// the agent's proxy does: a connection from the guest's egress listener,
// one EgressRequest with the spawn's token, then raw bytes to the target.
func TestEgressThroughGuestListener(t *testing.T) {
	var hits atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte("hello from " + r.Host))
	}))
	defer target.Close()
	port := target.Listener.Addr().(*net.TCPAddr).Port

	guestEgress, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e := newTestEnvWith(t, func(o *Options) { o.EgressTestHosts = "allowed.test=127.0.0.1,blocked.test=127.0.0.1" })
	e.backend.egress = guestEgress
	g := e.start()
	e.spawn(map[string]any{"id": "p", "name": "s", "command": "/bin/true", "allowedDomains": []string{"allowed.test"}})
	sp, _ := g.agent.spawned("p")

	dial := func(host, token string) (net.Conn, protocol.EgressReply) {
		conn, err := net.Dial("tcp", guestEgress.Addr().String())
		require.NoError(t, err)
		require.NoError(t, protocol.WriteEgressRequest(conn, protocol.EgressRequest{SpawnID: "p", Token: token, Host: host, Port: port}))
		rep, err := protocol.ReadEgressReply(conn)
		require.NoError(t, err)
		return conn, rep
	}
	conn, rep := dial("allowed.test", sp.EgressToken)
	require.True(t, rep.OK, rep.Error)
	_, err = conn.Write([]byte("GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	body := make([]byte, 64)
	n, _ := resp.Body.Read(body)
	assert.Equal(t, "hello from allowed.test", string(body[:n]))
	conn.Close()

	conn, rep = dial("blocked.test", sp.EgressToken)
	conn.Close()
	assert.True(t, rep.Blocked)
	assert.Contains(t, rep.Error, "blocked-by-allowlist")

	conn, rep = dial("allowed.test", "stolen")
	conn.Close()
	assert.False(t, rep.OK, "a wrong token gets nothing")
	assert.Equal(t, int32(1), hits.Load())
}

// TestStartVMProbesThroughEgress: without a ProbeClient the apiProbeURL
// HEAD takes the egress path (test host → 127.0.0.1), and networkStatus
// resolves the probe's host with the same resolver.
func TestStartVMProbesThroughEgress(t *testing.T) {
	var heads atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			heads.Add(1)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer target.Close()
	port := target.Listener.Addr().(*net.TCPAddr).Port
	e := newTestEnvWith(t, func(o *Options) {
		o.EgressTestHosts = "api.test=127.0.0.1"
		o.ProbeClient = nil
		o.NetworkCheck = nil
	})
	e.mustCall("startVM", map[string]any{"apiProbeURL": "http://api.test:" + strconv.Itoa(port) + "/"}, nil)
	var reach, status string
	for reach == "" || status == "" {
		ev := e.next(protocol.EventAPIReachability, protocol.EventNetworkStatus)
		if ev.Type == protocol.EventAPIReachability {
			reach = ev.Status
		} else {
			status = ev.Status
		}
	}
	assert.Equal(t, protocol.ReachabilityReachable, reach)
	assert.Equal(t, int32(1), heads.Load())
	assert.Contains(t, []string{protocol.NetworkConnected, protocol.NetworkNotConnected}, status)
}

// TestStartVMUnreachableProbe: a probe target that does not answer is
// probably_unreachable after the first probe.
func TestStartVMUnreachableProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	l.Close() // nothing listens there now
	e := newTestEnvWith(t, func(o *Options) {
		o.EgressTestHosts = "api.test=127.0.0.1"
		o.ProbeClient = nil
	})
	e.mustCall("startVM", map[string]any{"apiProbeURL": "http://api.test:" + strconv.Itoa(port) + "/"}, nil)
	ev := e.next(protocol.EventAPIReachability)
	assert.Equal(t, protocol.ReachabilityProbablyUnreachable, ev.Status)
}
