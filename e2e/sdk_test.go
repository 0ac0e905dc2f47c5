package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/fakeapi"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/sdkturn"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
	"github.com/cowork-vmm/cowork-vmm/testharness/sdkcache"
)

// TestRealSDK runs the real Claude Code CLI the way the desktop client
// does, on the process backend (TestKVMRealSDK: the VM).
func TestRealSDK(t *testing.T) { realSDK(t, e2eBackend(t)) }

// TestKVMRealSDK is TestRealSDK in a VM where this host's KVM boots Linux
// (TestNestedKVMRealWorkload runs it in the harness elsewhere).
func TestKVMRealSDK(t *testing.T) {
	realSDK(t, kvmBackend(t, "TestNestedKVMRealWorkload"))
	recordBoot(t)
}

// TestNestedKVMRealWorkload runs TestKVMRealSDK and
// TestKVMBusyGuestStaysConnected inside the nested harness. The outer
// guest sees the host's root but has a /root of its own, so the fetched
// CLI's directory is shared at its own path; the outer guest gets memory
// for a 2 GiB guest running a 428 MB executable.
func TestNestedKVMRealWorkload(t *testing.T) {
	sdk, sdkErr := sdkcache.Find()
	var env []string
	if sdkErr == nil {
		env = append(env, sdkcache.DirEnv+"="+sdk.Dir)
	}
	// COWORK_VMM_E2E_REPEAT=N runs them N times in one outer boot (the
	// 10-out-of-10 check); CI runs them once.
	repeat, err := strconv.Atoi(os.Getenv("COWORK_VMM_E2E_REPEAT"))
	if err != nil || repeat < 1 {
		repeat = 1
	}
	gt := nestedKVMTest(t, "^(TestKVMRealSDK|TestKVMBusyGuestStaysConnected)$", time.Duration(repeat)*20*time.Minute, 1, env...)
	gt.Args = append(gt.Args, "-test.count="+strconv.Itoa(repeat))
	gt.MemMiB = 5120 // + the CLI's copy in the outer guest's /tmp
	if sdkErr == nil {
		gt.Shares = []string{sdk.Dir}
	}
	res := nested.RunGoTestWith(t, gt)
	figures := nested.FiguresIn(res.Output, sdkFiguresMarker)
	if sdkErr == nil && len(figures) == 0 {
		t.Error("the real-SDK test measured nothing inside the nested guest (skipped there?)")
	}
	nested.RecordFigures(t, figures...)
}

// sdkFiguresMarker starts every figure line realSDK records.
const sdkFiguresMarker = "real SDK "

// requireSDK skips t unless the pinned CLI is fetched.
func requireSDK(t *testing.T) sdkcache.SDK {
	t.Helper()
	sdk, err := sdkcache.Find()
	if err != nil {
		t.Skipf("the real SDK is unavailable: %v", err)
	}
	return sdk
}

// sdkTurnTimeout bounds one turn: a cold start of the 428 MB CLI in the
// nested harness's emulated guest takes tens of seconds.
const sdkTurnTimeout = 4 * time.Minute

// sdkSession is the session every real-SDK spawn runs in.
const sdkSession = "real-sdk"

// sdkRun is one spawn of the CLI through the helper.
type sdkRun struct {
	c     *client
	ev    *events
	api   string // the fake API's base URL, as the guest names it
	allow []string
}

// realSDK: installSdk of the real CLI, then `claude -p` (stdin closed) and
// two stream-json turns sent with writeStdin, answered by a fake Messages
// API served on loopback as an allowedDomains host through the helper's
// egress proxy; a spawn pointed at an unlisted host is refused. It logs
// spawn → first stdout byte and spawn → exit beside the same binary run
// natively on this host against the same API.
func realSDK(t *testing.T, backend string) {
	sdk := localCopy(t, requireSDK(t))
	api := &fakeapi.Handler{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	port := strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)

	h := startHelper(t, backend)
	c := profilePipe(t, h.socket, "real-sdk")
	ev := subscribeProfile(t, h.socket, "real-sdk")
	c.call("configure", map[string]any{"userDataName": "real-sdk", "userDataRoot": contractRoot, "memoryMB": 2048, "cpuCount": 1}, nil)
	c.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "memoryGB": 2.0, "cpuCount": 1}, nil)
	waitConnected(t, c)
	c.call("installSdk", map[string]any{"sdkSubpath": strings.TrimPrefix(sdk.Dir, "/"), "version": sdk.Version}, nil)

	r := sdkRun{c: c, ev: ev, api: "http://allowed.test:" + port, allow: []string{"allowed.test"}}
	var figures []string
	figure := func(format string, args ...any) {
		prefix := fmt.Sprintf("%s%s on the %s backend: ", sdkFiguresMarker, sdk.Version, backend)
		figures = append(figures, prefix+fmt.Sprintf(format, args...))
	}
	for _, run := range []string{"cold", "warm"} {
		first, exit := r.printTurn(t, "print-"+run, "print turn "+run)
		figure("claude -p (%s) spawn → first stdout byte %v, → exit %v", run, ms(first), ms(exit))
	}
	first, exit := r.streamJSONTurns(t, "stream-json", "stream turn one", "stream turn two")
	figure("stream-json spawn → first stdout byte %v, two turns → exit %v", ms(first), ms(exit))
	r.refusedHost(t, "refused", "http://blocked.test:"+port, api)
	assert.Equal(t, []string{"print turn cold", "print turn warm", "stream turn one", "stream turn two"}, api.Answered(),
		"every turn reached the fake API, in order")
	assert.Contains(t, h.stderr.String(), "egress blocked by allowedDomains", "the refusal is logged")

	for _, run := range []string{"cold", "warm"} {
		first, exit := nativePrintTurn(t, sdk, srv.URL)
		figure("claude -p (%s) run natively beside it: first stdout byte %v, exit %v", run, ms(first), ms(exit))
	}
	nested.RecordFigures(t, figures...)
	c.call("stopVM", nil, nil)
}

// localCopy copies the CLI into the test's own directory, as the client
// keeps it on its local disk: in the nested harness the cache is the
// host's, reached over the outer guest's uncached 9p share, whose every
// read would weigh on both the guest's figures and the native ones.
func localCopy(t *testing.T, sdk sdkcache.SDK) sdkcache.SDK {
	t.Helper()
	local := sdkcache.SDK{Dir: t.TempDir(), Version: sdk.Version}
	require.NoError(t, os.Mkdir(filepath.Dir(local.Binary()), 0o755))
	src, err := os.Open(sdk.Binary())
	require.NoError(t, err)
	defer src.Close()
	dst, err := os.OpenFile(local.Binary(), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, dst.Close())
	return local
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// spawn starts the CLI with args as the client does and returns when.
func (r sdkRun) spawn(t *testing.T, id, base string, args ...string) time.Time {
	t.Helper()
	start := time.Now()
	r.c.call("spawn", map[string]any{"id": id, "name": sdkSession, "command": "/usr/local/bin/claude",
		"args": args, "env": sdkturn.APIEnv(base), "allowedDomains": r.allow}, nil)
	return start
}

// exit waits for id's exit event.
func (r sdkRun) exit(t *testing.T, id string) protocol.Event {
	t.Helper()
	exit, err := r.ev.tryWait("exit of "+id, sdkTurnTimeout, func(e protocol.Event) bool { return e.Type == protocol.EventExit && e.ID == id })
	require.NoError(t, err, "stdout %q, stderr %q", r.ev.output(protocol.EventStdout, id), r.ev.output(protocol.EventStderr, id))
	return exit
}

// firstStdout is when id's first stdout chunk arrived.
func (r sdkRun) firstStdout(id string) time.Time {
	at, _ := r.ev.firstAt(id, func(e protocol.Event) bool { return e.Type == protocol.EventStdout })
	return at
}

// printTurn runs `claude -p prompt` with its stdin closed at once and
// checks the answer.
func (r sdkRun) printTurn(t *testing.T, id, prompt string) (first, exit time.Duration) {
	t.Helper()
	start := r.spawn(t, id, r.api, "-p", prompt)
	r.c.call("writeStdin", map[string]any{"id": id, "data": "", "eof": true}, nil)
	end := r.ev.exitOK(id, sdkTurnTimeout)
	assert.Equal(t, fakeapi.AnswerPrefix+prompt+"\n", r.ev.output(protocol.EventStdout, id))
	return r.firstStdout(id).Sub(start), end.Sub(start)
}

// streamJSONTurns runs the client's own mode: stream-json in and out, one
// user message per turn written to stdin, each answered by a result line,
// then end of input ends the process.
func (r sdkRun) streamJSONTurns(t *testing.T, id string, prompts ...string) (first, exit time.Duration) {
	t.Helper()
	start := r.spawn(t, id, r.api, sdkturn.Args(sdkturn.ModeStream)...)
	for i, prompt := range prompts {
		r.c.call("writeStdin", map[string]any{"id": id, "data": string(sdkturn.StreamMessage(prompt))}, nil)
		_, err := r.ev.tryWait(fmt.Sprintf("result %d of %s", i+1, id), sdkTurnTimeout, func(e protocol.Event) bool {
			if e.Type == protocol.EventExit && e.ID == id {
				t.Fatalf("%s exited mid-conversation: %+v, stderr %q", id, e, r.ev.outputLocked(protocol.EventStderr, id))
			}
			return strings.Count(r.ev.outputLocked(protocol.EventStdout, id), `"type":"result"`) > i
		})
		require.NoError(t, err)
	}
	r.c.call("writeStdin", map[string]any{"id": id, "data": "", "eof": true}, nil)
	end := r.ev.exitOK(id, sdkTurnTimeout)
	out := r.ev.output(protocol.EventStdout, id)
	for _, prompt := range prompts {
		assert.Contains(t, out, fakeapi.AnswerPrefix+prompt, "the answer to %q", prompt)
	}
	return r.firstStdout(id).Sub(start), end.Sub(start)
}

// refusedHost points the CLI at a host outside allowedDomains: the proxy
// refuses it, the turn fails and the API sees nothing.
func (r sdkRun) refusedHost(t *testing.T, id, base string, api *fakeapi.Handler) {
	t.Helper()
	before := len(api.Requests())
	r.spawn(t, id, base, "-p", "never answered")
	r.c.call("writeStdin", map[string]any{"id": id, "data": "", "eof": true}, nil)
	exit := r.exit(t, id)
	out := r.ev.output(protocol.EventStdout, id) + r.ev.output(protocol.EventStderr, id)
	require.NotNil(t, exit.ExitCode, "%+v", exit)
	assert.NotEqual(t, 0, *exit.ExitCode, "a turn against an unlisted host fails: %q", out)
	assert.NotContains(t, out, fakeapi.AnswerPrefix)
	assert.Len(t, api.Requests(), before, "nothing reached the API through the refused host")
	t.Logf("an unlisted host: exit %d, %q", *exit.ExitCode, strings.TrimSpace(out))
}

// nativePrintTurn runs the same binary on this host, outside any guest,
// against the same API, as the figures' peer.
func nativePrintTurn(t *testing.T, sdk sdkcache.SDK, base string) (first, exit time.Duration) {
	t.Helper()
	timing, err := sdkturn.Run(t.Context(), sdkturn.Spec{Binary: sdk.Binary(), Mode: sdkturn.ModePrint, Home: t.TempDir(), APIURL: base})
	require.NoError(t, err, "native run")
	return timing.FirstByte, timing.Exit
}
