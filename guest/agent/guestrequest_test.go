package agent

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
)

// spawnGuestRequest spawns this test binary as `cowork-vmm guest-request
// args...` (TestMain), as a guest process would run GuestToolPath.
func (c *testClient) spawnGuestRequest(id string, args ...string) {
	c.t.Helper()
	exe, err := os.Executable()
	require.NoError(c.t, err)
	require.NoError(c.t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: id, Command: exe, Args: args, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin", testGuestRequestEnv + "=1"},
	}, nil))
}

// nextRequest waits for process id's n-th guest request (from 1).
func (c *testClient) nextRequest(id string, n int) protocol.GuestRequest {
	c.t.Helper()
	p := c.WaitFor(id, "a guest request", func(p *agenttest.Output) bool { return len(p.Requests) >= n || p.Exit != nil })
	require.GreaterOrEqual(c.t, len(p.Requests), n, "exited without asking: %s", p.Stderr.String())
	return p.Requests[n-1]
}

// TestGuestRequestRoundTrip: a process's guest-request call reaches the
// helper as a request event of its spawn (method, params, timeout), and the
// helper's guestResponse is its answer: a result printed, exit 0; an error,
// exit 1. Answering again, or an id never asked, is refused.
func TestGuestRequestRoundTrip(t *testing.T) {
	c := startAgent(t, Options{})
	c.spawnGuestRequest("asker", "--timeout", "90s", "askUser", `{"question":"ok?","n":12345678901234567890}`)
	req := c.nextRequest("asker", 1)
	assert.Equal(t, "askUser", req.Method)
	assert.JSONEq(t, `{"question":"ok?","n":12345678901234567890}`, string(req.Params))
	assert.Contains(t, string(req.Params), "12345678901234567890", "params pass as the caller's JSON text")
	assert.Equal(t, int64(90000), req.TimeoutMillis)
	require.NoError(t, c.Call(protocol.AgentMethodGuestResponse, protocol.GuestResponseParams{ID: req.ID, Result: json.RawMessage(`{"answer":"yes"}`)}, nil))
	p := c.WaitExit("asker")
	require.NotNil(t, p.Exit.ExitCode, p.Stderr.String())
	assert.Equal(t, 0, *p.Exit.ExitCode, p.Stderr.String())
	assert.JSONEq(t, `{"answer":"yes"}`, p.Stdout.String())

	err := c.Call(protocol.AgentMethodGuestResponse, protocol.GuestResponseParams{ID: req.ID, Result: json.RawMessage(`1`)}, nil)
	assert.ErrorContains(t, err, "no guest request of that id is waiting")
	err = c.Call(protocol.AgentMethodGuestResponse, protocol.GuestResponseParams{ID: 999999}, nil)
	assert.ErrorContains(t, err, "no guest request of that id is waiting")

	c.spawnGuestRequest("refused", "deleteEverything")
	req = c.nextRequest("refused", 1)
	assert.JSONEq(t, `{}`, string(req.Params), "params default to {}")
	require.NoError(t, c.Call(protocol.AgentMethodGuestResponse, protocol.GuestResponseParams{ID: req.ID, Error: "the user said no"}, nil))
	p = c.WaitExit("refused")
	assert.Equal(t, 1, *p.Exit.ExitCode)
	assert.Contains(t, p.Stderr.String(), "deleteEverything: the user said no")
	assert.Empty(t, p.Stdout.String())
}

// TestGuestRequestCommandUsage: the command refuses bad arguments and says
// where it needs to run.
func TestGuestRequestCommandUsage(t *testing.T) {
	var out, errOut strings.Builder
	assert.Equal(t, 2, GuestRequestMain(nil, &out, &errOut))
	assert.Contains(t, errOut.String(), "usage: cowork-vmm guest-request")
	errOut.Reset()
	assert.Equal(t, 2, GuestRequestMain([]string{"m", "{not json"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "not JSON")
	errOut.Reset()
	t.Setenv(protocol.GuestRequestSocketEnv, "")
	assert.Equal(t, 2, GuestRequestMain([]string{"m"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "$"+protocol.GuestRequestSocketEnv+" is not set")
	assert.Empty(t, out.String())
}

// socketOf starts a process that prints its guest-request socket and waits
// on its stdin, and returns that path.
func (c *testClient) socketOf(id string) string {
	c.t.Helper()
	c.spawn(id, "sh", "-c", `echo "$`+protocol.GuestRequestSocketEnv+`"; exec cat`)
	p := c.WaitFor(id, "its socket", func(p *agenttest.Output) bool { return strings.Contains(p.Stdout.String(), "\n") || p.Exit != nil })
	return strings.TrimSpace(p.Stdout.String())
}

// rawCall sends body as one frame on the socket and returns the answer.
func rawCall(t *testing.T, socket string, body []byte) protocol.Response {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(body)))
	// The agent may answer (and close) before taking it all.
	go func() { _, _ = conn.Write(append(hdr[:], body...)) }()
	raw, err := protocol.ReadFrame(conn)
	require.NoError(t, err)
	var resp protocol.Response
	require.NoError(t, json.Unmarshal(raw, &resp))
	return resp
}

// TestGuestRequestBounds: the socket refuses, without asking the helper,
// a call too big (checked before it is read), without a method, with
// params over the limit, and a call beyond the waiting limit; a caller
// that hangs up gives its call up; the socket goes with the process.
func TestGuestRequestBounds(t *testing.T) {
	c := startAgent(t, Options{})
	socket := c.socketOf("holder")
	require.True(t, strings.HasPrefix(filepath.Base(socket), "guest-request-"), socket)

	resp := rawCall(t, socket, make([]byte, protocol.MaxGuestCallBytes+1))
	assert.Contains(t, resp.Error, "at most")
	resp = rawCall(t, socket, []byte(`{"params":{}}`))
	assert.Contains(t, resp.Error, "needs a method")
	big, err := json.Marshal(protocol.GuestCall{Method: "m", Params: json.RawMessage(`"` + strings.Repeat("x", protocol.MaxGuestRequestParamsBytes) + `"`)})
	require.NoError(t, err)
	resp = rawCall(t, socket, big)
	assert.Contains(t, resp.Error, "params are")
	resp = rawCall(t, socket, []byte(`[1,2]`))
	assert.Contains(t, resp.Error, "not a GuestCall")

	// Fill the waiting limit with callers that wait; one more is refused.
	var conns []net.Conn
	for i := range protocol.MaxGuestRequestsPerSession {
		conn, err := net.Dial("unix", socket)
		require.NoError(t, err)
		conns = append(conns, conn)
		require.NoError(t, protocol.WriteJSON(conn, protocol.GuestCall{Method: "wait"}))
		c.nextRequest("holder", i+1)
	}
	resp = rawCall(t, socket, []byte(`{"method":"one too many"}`))
	assert.Contains(t, resp.Error, "too many guest requests of this process are waiting")
	// A caller that hangs up: its answer finds nobody.
	first := c.nextRequest("holder", 1)
	conns[0].Close()
	require.Eventually(t, func() bool {
		return c.Call(protocol.AgentMethodGuestResponse, protocol.GuestResponseParams{ID: first.ID}, nil) != nil
	}, 10*time.Second, 10*time.Millisecond)
	for _, conn := range conns[1:] {
		conn.Close()
	}

	require.NoError(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "holder", Signal: "SIGKILL"}, nil))
	c.WaitExit("holder")
	_, err = os.Stat(socket)
	assert.ErrorIs(t, err, os.ErrNotExist, "the socket goes with its process")
}

// TestGuestRequestBackstopAndShutdown: a call the helper never answers is
// answered by the agent after its timeout and the backstop; when the agent
// ends, waiting calls are answered at once and new ones refused.
func TestGuestRequestBackstopAndShutdown(t *testing.T) {
	helperEnd, agentEnd := net.Pipe()
	defer helperEnd.Close()
	go func() { _, _ = io.Copy(io.Discard, helperEnd) }()
	a := &agent{log: slog.New(slog.DiscardHandler), server: agentrpc.NewServer(agentEnd, nil, agentrpc.ServerOptions{})}
	r := newGuestRequests(a)
	r.backstop = 10 * time.Millisecond
	ep, err := r.listen("p", filepath.Join(t.TempDir(), "s.sock"), true)
	require.NoError(t, err)
	go ep.serve()
	defer ep.close()

	start := time.Now()
	resp, err := CallGuest(ep.path, protocol.GuestCall{Method: "m", TimeoutMillis: 20})
	require.NoError(t, err)
	assert.False(t, resp.Success)
	assert.Contains(t, resp.Error, "no answer from the helper within 1.01s", "the timeout's floor, and the backstop")
	assert.GreaterOrEqual(t, time.Since(start), 1010*time.Millisecond)

	r.backstop = time.Hour
	done := make(chan protocol.Response, 1)
	go func() {
		resp, err := CallGuest(ep.path, protocol.GuestCall{Method: "m"})
		assert.NoError(t, err)
		done <- resp
	}()
	require.Eventually(t, func() bool { return ep.waiting.Load() == 1 }, 10*time.Second, time.Millisecond)
	r.closeAll()
	resp = <-done
	assert.Equal(t, "the guest agent is shutting down", resp.Error)
	resp, err = CallGuest(ep.path, protocol.GuestCall{Method: "m"})
	require.NoError(t, err)
	assert.Equal(t, "the guest agent is shutting down", resp.Error)
}

// TestChildAgentGuestRequestIsolated runs the agent as the VM does (real
// root, --isolate-sessions): each isolated spawn finds the guest-request
// command at GuestToolPath and its own socket in its own /run — the only
// one there — and its calls reach the helper as its own requests.
func TestChildAgentGuestRequestIsolated(t *testing.T) {
	c := startChildAgent(t, []string{"--isolate-sessions"})
	c.setupHostSystem()
	for _, s := range []string{"a", "b"} {
		home := t.TempDir()
		require.NoError(t, os.Chmod(home, 0o700))
		c.bind(home, "/sessions/"+s, false)
	}
	for _, s := range []string{"a", "b"} {
		require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
			ID: "ask-" + s, Session: s, UID: sessionUIDOf(s), Command: "/bin/sh", Cwd: "/sessions/" + s,
			Args: []string{"-c", `ls /run/cowork; echo "$` + protocol.GuestRequestSocketEnv + `"; exec ` + protocol.GuestToolPath + ` guest-request whoami '{"from":"` + s + `"}'`},
			Env:  []string{"PATH=/usr/bin:/bin", "HOME=/sessions/" + s, testGuestRequestEnv + "=1"},
		}, nil))
	}
	for _, s := range []string{"b", "a"} {
		req := c.nextRequest("ask-"+s, 1)
		assert.Equal(t, "whoami", req.Method)
		assert.JSONEq(t, `{"from":"`+s+`"}`, string(req.Params), "ask-%s's request is its own", s)
		require.NoError(t, c.Call(protocol.AgentMethodGuestResponse, protocol.GuestResponseParams{ID: req.ID, Result: json.RawMessage(`"you are ` + s + `"`)}, nil))
	}
	for _, s := range []string{"a", "b"} {
		p := c.WaitExit("ask-" + s)
		require.NotNil(t, p.Exit.ExitCode, p.Stderr.String())
		assert.Equal(t, 0, *p.Exit.ExitCode, p.Stderr.String())
		assert.Equal(t, "bin\nguest-request.sock\n"+guestRequestSocket+"\n\"you are "+s+"\"\n", p.Stdout.String(), p.Stderr.String())
	}
}
