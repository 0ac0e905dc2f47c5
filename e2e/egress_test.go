package e2e

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// curlPath is the HTTP client run inside the guest; the guest sees the
// host's /usr read-only.
const curlPath = "/usr/bin/curl"

// TestEgressAllowedDomains drives the built binary as the client does and
// checks, from inside the guest, that a spawn's traffic goes only through
// its proxy and only to its allowedDomains. The test servers listen on
// 127.0.0.1; COWORK_VMM_EGRESS_TEST_HOSTS maps the test names to them (see
// e2eTestHosts), so nothing leaves loopback.
func TestEgressAllowedDomains(t *testing.T) { egressAllowedDomains(t, e2eBackend(t)) }

// TestKVMEgressAllowedDomains is TestEgressAllowedDomains on the kvm
// backend, over the VM's egress vsock port (TestNestedKVMEgress runs it in
// the harness where this KVM cannot boot Linux).
func TestKVMEgressAllowedDomains(t *testing.T) {
	egressAllowedDomains(t, kvmBackend(t, "TestNestedKVMEgress"))
	recordBoot(t)
}

func egressAllowedDomains(t *testing.T, backend string) {
	if _, err := os.Stat(curlPath); err != nil {
		t.Skipf("%s is needed as the guest's HTTP client: %v", curlPath, err)
	}

	var mu sync.Mutex
	var hits []string // "host path" of every request the servers saw
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits = append(hits, r.Method+" "+r.Host+" "+r.URL.Path)
		mu.Unlock()
		w.Write([]byte("answer for " + r.URL.Path + "\n"))
	})
	plain := httptest.NewServer(handler)
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(handler)
	defer tlsSrv.Close()
	port := strconv.Itoa(plain.Listener.Addr().(*net.TCPAddr).Port)
	tlsPort := strconv.Itoa(tlsSrv.Listener.Addr().(*net.TCPAddr).Port)
	sawHit := func(want string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, h := range hits {
			if h == want {
				return true
			}
		}
		return false
	}

	h := startHelper(t, backend)
	const profile, root = "egress", "/home/e2e/.config/Claude"
	pipe, err := protocol.DialPipe(t.Context(), h.socket)
	require.NoError(t, err)
	defer pipe.Close()
	h.pipe = pipe
	h.call("configure", map[string]any{"userDataName": profile, "userDataRoot": root, "sessionOnly": true}, nil)
	ev := subscribe(t, h.socket, map[string]any{"userDataName": profile, "userDataRoot": root})
	h.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"),
		"apiProbeURL": "http://allowed.test:" + port + "/probe"}, nil)

	// Start-up events: the probe took the egress path to the test server.
	reach := ev.wait("apiReachability", func(e protocol.Event) bool { return e.Type == protocol.EventAPIReachability })
	assert.Equal(t, protocol.ReachabilityReachable, reach.Status)
	status := ev.wait("networkStatus", func(e protocol.Event) bool { return e.Type == protocol.EventNetworkStatus })
	assert.Contains(t, []string{protocol.NetworkConnected, protocol.NetworkNotConnected}, status.Status)
	assert.True(t, sawHit("HEAD allowed.test:"+port+" /probe"), "the probe's HEAD reached the server")
	waitConnected(t, h.client)

	allowed := []string{"allowed.test", "*.wild.test"}
	// curl runs one request per spawn; -i shows the status line and headers.
	run := func(id string, domains []string, args ...string) (out string, exitCode int) {
		t.Helper()
		params := map[string]any{"id": id, "name": "egress-session", "command": curlPath,
			"args": append([]string{"-sS", "-i", "--max-time", "20"}, args...)}
		if domains != nil {
			params["allowedDomains"] = domains
		}
		h.call("spawn", params, nil)
		exit := ev.exit(id)
		require.NotNil(t, exit.ExitCode, "%s: %+v", id, exit)
		return ev.output(protocol.EventStdout, id) + ev.output(protocol.EventStderr, id), *exit.ExitCode
	}

	// The environment points at the proxy.
	h.call("spawn", map[string]any{"id": "env", "name": "egress-session", "command": "/bin/sh",
		"args": []string{"-c", `echo "$HTTPS_PROXY|$https_proxy|$HTTP_PROXY|$http_proxy|$NO_PROXY"`}, "allowedDomains": allowed}, nil)
	ev.exit("env")
	vars := strings.Split(strings.TrimSuffix(ev.output(protocol.EventStdout, "env"), "\n"), "|")
	require.Len(t, vars, 5)
	assert.Regexp(t, `^http://127\.0\.0\.1:\d+$`, vars[0])
	assert.Equal(t, []string{vars[0], vars[0], vars[0], "localhost,127.0.0.1"}, vars[1:])

	t.Run("allowed over HTTP", func(t *testing.T) {
		out, code := run("http-allowed", allowed, "http://allowed.test:"+port+"/plain")
		assert.Equal(t, 0, code, out)
		assert.Contains(t, out, "200 OK")
		assert.Contains(t, out, "answer for /plain")
		assert.True(t, sawHit("GET allowed.test:"+port+" /plain"))
	})
	t.Run("allowed over CONNECT", func(t *testing.T) {
		// The test server's certificate is not for allowed.test: -k.
		out, code := run("tls-allowed", allowed, "-k", "https://allowed.test:"+tlsPort+"/tls")
		assert.Equal(t, 0, code, out)
		assert.Contains(t, out, "answer for /tls")
		assert.True(t, sawHit("GET allowed.test:"+tlsPort+" /tls"))
	})
	t.Run("blocked gets 403", func(t *testing.T) {
		out, code := run("http-blocked", allowed, "http://blocked.test:"+port+"/nope")
		assert.Equal(t, 0, code, out) // curl got an HTTP answer
		assert.Contains(t, out, "HTTP/1.1 403 Forbidden")
		assert.Contains(t, out, "X-Cowork-Egress: blocked-by-allowlist")
		assert.Contains(t, out, "blocked-by-allowlist")
		assert.Contains(t, out, "blocked.test")
		assert.False(t, sawHit("GET blocked.test:"+port+" /nope"))

		out, code = run("tls-blocked", allowed, "-k", "https://blocked.test:"+tlsPort+"/nope")
		assert.NotEqual(t, 0, code, "CONNECT refused: %s", out)
		assert.Contains(t, out, "403")
	})
	t.Run("wildcard", func(t *testing.T) {
		out, code := run("wild-sub", allowed, "http://sub.wild.test:"+port+"/wild")
		assert.Equal(t, 0, code, out)
		assert.Contains(t, out, "answer for /wild")
		out, _ = run("wild-evil", allowed, "http://evil-wild.test:"+port+"/evil")
		assert.Contains(t, out, "HTTP/1.1 403 Forbidden")
		assert.Contains(t, out, "X-Cowork-Egress: blocked-by-allowlist")
		assert.False(t, sawHit("GET evil-wild.test:"+port+" /evil"))
	})
	t.Run("the *, .domain and host:port forms", func(t *testing.T) {
		out, code := run("star", []string{"*"}, "http://blocked.test:"+port+"/star")
		assert.Equal(t, 0, code, out)
		assert.Contains(t, out, "answer for /star", `"*" allows every name`)
		dot := []string{".wild.test"}
		for _, host := range []string{"wild.test", "sub.wild.test"} {
			out, code := run("dot-"+host, dot, "http://"+host+":"+port+"/dot")
			assert.Equal(t, 0, code, out)
			assert.Contains(t, out, "answer for /dot", ".wild.test allows %s", host)
		}
		out, _ = run("dot-evil", dot, "http://evil-wild.test:"+port+"/dot-evil")
		assert.Contains(t, out, "HTTP/1.1 403 Forbidden")
		withPort := []string{"allowed.test:" + port}
		out, code = run("port-ok", withPort, "http://allowed.test:"+port+"/port")
		assert.Equal(t, 0, code, out)
		assert.Contains(t, out, "answer for /port")
		out, _ = run("port-other", withPort, "-k", "https://allowed.test:"+tlsPort+"/port-other")
		assert.Contains(t, out, "403", "host:port allows that port only")
		assert.False(t, sawHit("GET allowed.test:"+tlsPort+" /port-other"))
	})
	t.Run("bypassing the proxy fails", func(t *testing.T) {
		out, code := run("direct", allowed, "--noproxy", "*", "--max-time", "5", "http://127.0.0.1:"+port+"/direct")
		assert.NotEqual(t, 0, code, "a direct connection must fail: %s", out)
		assert.NotContains(t, out, "answer for")
		assert.False(t, sawHit("GET 127.0.0.1:"+port+" /direct"))
		out, code = run("direct-name", allowed, "--noproxy", "*", "--max-time", "5", "http://allowed.test:"+port+"/direct-name")
		assert.NotEqual(t, 0, code, "no name resolves without the proxy: %s", out)
	})
	t.Run("empty allowedDomains refuses everything", func(t *testing.T) {
		out, _ := run("empty", []string{}, "http://allowed.test:"+port+"/empty")
		assert.Contains(t, out, "HTTP/1.1 403 Forbidden")
		assert.False(t, sawHit("GET allowed.test:"+port+" /empty"))
	})
	t.Run("absent allowedDomains allows all, through the proxy", func(t *testing.T) {
		out, code := run("absent", nil, "http://allowed.test:"+port+"/absent")
		assert.Equal(t, 0, code, out)
		assert.Contains(t, out, "answer for /absent")
		out, code = run("absent-direct", nil, "--noproxy", "*", "--max-time", "5", "http://127.0.0.1:"+port+"/absent-direct")
		assert.NotEqual(t, 0, code, "still no direct route: %s", out)
		assert.False(t, sawHit("GET 127.0.0.1:"+port+" /absent-direct"))
	})

	assert.Contains(t, h.stderr.String(), "TEST MODE", "the test hook is announced in the log")
	assert.Contains(t, h.stderr.String(), "egress blocked by allowedDomains", "refusals are logged")

	// The same after stopVM and startVM: on the kvm backend the guest is
	// suspended and resumed (its proxy's vsock port dialed anew).
	h.call("stopVM", nil, nil)
	h.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle")}, nil)
	waitConnected(t, h.client)
	t.Logf("the guest after stopVM and startVM: resumed=%v", strings.Contains(h.stderr.String(), "guest resumed"))
	out, code := run("again-allowed", allowed, "http://allowed.test:"+port+"/again")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "answer for /again")
	out, _ = run("again-blocked", allowed, "http://blocked.test:"+port+"/again-nope")
	assert.Contains(t, out, "X-Cowork-Egress: blocked-by-allowlist")
	assert.False(t, sawHit("GET blocked.test:"+port+" /again-nope"))
	h.call("stopVM", nil, nil)
}
