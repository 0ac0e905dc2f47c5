package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
)

func TestParseSudoArgs(t *testing.T) {
	t.Setenv("SHELL", "/bin/bash")
	for _, tc := range []struct {
		args []string
		want []string
		err  string
	}{
		{args: []string{"apt-get", "install", "-y", "./x.deb"}, want: []string{"apt-get", "install", "-y", "./x.deb"}},
		{args: []string{"-E", "-H", "-n", "--", "-weird"}, want: []string{"-weird"}},
		{args: []string{"-u", "root", "id"}, want: []string{"id"}},
		{args: []string{"--user=root", "id"}, want: []string{"id"}},
		{args: []string{"-s"}, want: []string{"/bin/bash"}},
		{args: []string{"-i", "echo", "a", "b"}, want: []string{"/bin/bash", "-c", "echo a b"}},
		{args: []string{"-u", "nobody", "id"}, err: `only root can be asked for here, not "nobody"`},
		{args: []string{"-u"}, err: "option -u needs a user"},
		{args: []string{"-A", "id"}, err: "option -A is not supported here"},
		{args: nil, err: "no command given"},
		{args: []string{"-E"}, err: "no command given"},
	} {
		got, err := parseSudoArgs(tc.args)
		if tc.err != "" {
			assert.EqualError(t, err, tc.err, "%q", tc.args)
			continue
		}
		require.NoError(t, err, "%q", tc.args)
		assert.Equal(t, tc.want, got, "%q", tc.args)
	}
}

// TestSudoIdentity: a sudo command is uid 0 of a namespace where 0 is the
// session's uid and the kernel's root is rootOwnerAlias; the other owners
// keep their ids.
func TestSudoIdentity(t *testing.T) {
	id := identityFor(100001, []owner{{0, 0}, {1000, 1000}, {rootOwnerAlias, 7}})
	root := id.asRoot()
	assert.Equal(t, uint32(0), root.uid)
	assert.Equal(t, uint32(0), root.gid)
	assert.Equal(t, []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100001, Size: 1}, {ContainerID: rootOwnerAlias, HostID: 0, Size: 1},
		{ContainerID: 1000, HostID: 1000, Size: 1}}, root.uidMap, "an owner whose id is the alias is left out")
	assert.Equal(t, []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100001, Size: 1}, {ContainerID: rootOwnerAlias, HostID: 0, Size: 1},
		{ContainerID: 1000, HostID: 1000, Size: 1}, {ContainerID: 7, HostID: 7, Size: 1}}, root.gidMap)
}

func TestCheckSudoParams(t *testing.T) {
	ok := protocol.SudoParams{Path: "/bin/true", Argv: []string{"true"}, Cwd: "/", Env: []string{"A=b"}}
	require.NoError(t, checkSudoParams(ok))
	for name, mutate := range map[string]func(*protocol.SudoParams){
		"relative path": func(p *protocol.SudoParams) { p.Path = "true" },
		"NUL in path":   func(p *protocol.SudoParams) { p.Path = "/bin/t\x00rue" },
		"no argv":       func(p *protocol.SudoParams) { p.Argv = nil },
		"relative cwd":  func(p *protocol.SudoParams) { p.Cwd = "sessions" },
		"NUL in argv":   func(p *protocol.SudoParams) { p.Argv = []string{"a\x00"} },
		"NUL in env":    func(p *protocol.SudoParams) { p.Env = []string{"A=\x00"} },
	} {
		p := ok
		mutate(&p)
		assert.Error(t, checkSudoParams(p), name)
	}
}

// sudoCapMask is sudoCaps as /proc/self/status prints a capability set.
func sudoCapMask() string {
	var mask uint64
	for _, c := range sudoCaps {
		mask |= 1 << c
	}
	return fmt.Sprintf("%016x", mask)
}

// TestChildAgentSudo runs the agent as the VM does (real root,
// --isolate-sessions): sudo in an isolated spawn runs its command as uid 0
// with only sudoCaps, as the session's own uid on the files it makes, with
// the caller's standard descriptors and exit status; options it cannot
// honour are refused; a signal to the caller reaches the command, and a
// killed caller takes the command with it.
func TestChildAgentSudo(t *testing.T) {
	c := startChildAgent(t, []string{"--isolate-sessions"})
	c.setupHostSystem()
	home := t.TempDir()
	require.NoError(t, os.Chmod(home, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(home, "root-owned"), []byte("a\n"), 0o644))
	c.bind(home, "/sessions/a", false)
	env := []string{"PATH=/usr/bin:/bin", "HOME=/sessions/a", testGuestRequestEnv + "=1"}
	spawn := func(id string, args ...string) {
		t.Helper()
		require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
			ID: id, Session: "a", UID: sessionUIDOf("a"), Command: args[0], Args: args[1:], Cwd: "/sessions/a", Env: env}, nil))
	}

	spawn("ids", "/bin/sh", "-c", `set -u
id -u
sudo id -u
sudo sh -c 'grep -E "^Cap(Bnd|Eff)" /proc/self/status; echo "$PWD"'
echo from-stdin | sudo cat
sudo sh -c 'echo to-stderr >&2; exit 3'; echo "rc=$?"
sudo sh -c 'echo b >> root-owned; echo made > made-by-sudo'
sudo -u nobody true; echo "rc=$?"
echo "$PATH"`)
	p := c.WaitExit("ids")
	require.NotNil(t, p.Exit.ExitCode, "%+v: %s", p.Exit, p.Stderr.String())
	lines := strings.Split(strings.TrimSpace(p.Stdout.String()), "\n")
	require.Len(t, lines, 9, "stdout %q, stderr %q", p.Stdout.String(), p.Stderr.String())
	uid, err := strconv.Atoi(lines[0])
	require.NoError(t, err)
	assert.GreaterOrEqual(t, uid, protocol.FirstSessionUID)
	assert.Equal(t, "0", lines[1], "sudo's command is root")
	assert.Equal(t, "CapEff:\t"+sudoCapMask(), lines[2], "its capabilities are sudoCaps")
	assert.Equal(t, "CapBnd:\t"+sudoCapMask(), lines[3], "and it cannot get more")
	assert.Equal(t, "/sessions/a", lines[4], "in the caller's working directory")
	assert.Equal(t, "from-stdin", lines[5], "the caller's standard input")
	assert.Equal(t, "rc=3", lines[6], "the command's exit status")
	assert.Equal(t, "rc=1", lines[7], "sudo -u nobody refused")
	assert.Equal(t, "/usr/bin:/bin:"+filepath.Dir(SudoToolPath), lines[8], "the tool's directory ends the PATH")
	assert.Contains(t, p.Stderr.String(), "to-stderr")
	assert.Contains(t, p.Stderr.String(), `only root can be asked for here, not "nobody"`)
	got, err := os.ReadFile(filepath.Join(home, "root-owned"))
	require.NoError(t, err)
	assert.Equal(t, "a\nb\n", string(got), "a root-owned file written through the mapped owner")
	st, err := os.Stat(filepath.Join(home, "made-by-sudo"))
	require.NoError(t, err)
	assert.Equal(t, uint32(uid), st.Sys().(*syscall.Stat_t).Uid, "what sudo makes is the session's uid's outside its namespace")

	// A signal the caller gets reaches the command.
	spawn("term", SudoToolPath, "sh", "-c", `trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done`)
	c.WaitFor("term", "ready", func(p *agenttest.Output) bool { return strings.Contains(p.Stdout.String(), "ready") || p.Exit != nil })
	require.NoError(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "term", Signal: "SIGTERM"}, nil))
	p = c.WaitExit("term")
	require.NotNil(t, p.Exit.ExitCode, "%+v: %s", p.Exit, p.Stderr.String())
	assert.Equal(t, 7, *p.Exit.ExitCode, "the command's status after its trap ran")
	assert.Equal(t, "ready\ngot-term\n", p.Stdout.String())

	// A caller killed outright takes its command with it.
	spawn("hold", SudoToolPath, "sh", "-c", `echo $$ > /sessions/a/held; echo ready; exec sleep 1000`)
	c.WaitFor("hold", "ready", func(p *agenttest.Output) bool { return strings.Contains(p.Stdout.String(), "ready") || p.Exit != nil })
	require.NoError(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "hold", Signal: "SIGKILL"}, nil))
	c.WaitExit("hold")
	spawn("gone", "/bin/sh", "-c", `pid=$(cat /sessions/a/held); i=0
while kill -0 "$pid" 2>/dev/null; do i=$((i+1)); [ $i -gt 400 ] && { echo still-there; exit 1; }; sleep 0.05; done
kill -0 "$pid" 2>&1 | grep -q 'No such process' && echo gone`)
	p = c.WaitExit("gone")
	assert.Equal(t, "gone\n", p.Stdout.String(), p.Stderr.String())
}

// sudoProbe makes raw calls on the guest-request socket as a hostile
// process might: sudo calls with the wrong number of descriptors or a
// relative command, an agent method that does not exist, and a sudo
// command whose caller then sends an oversized frame.
const sudoProbe = `
import json, os, socket, struct
path = os.environ["COWORK_GUEST_REQUEST_SOCKET"]
def send(obj, fds):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    body = json.dumps(obj).encode()
    frame = struct.pack(">I", len(body)) + body
    if fds:
        s.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("%di" % len(fds), *fds))])
    else:
        s.sendall(frame)
    return s
def answer(s):
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    return json.loads(s.recv(n, socket.MSG_WAITALL))
def sudo(fds, **kw):
    p = dict(path="/bin/true", argv=["true"], cwd="/", env=[])
    p.update(kw)
    return send({"method": "cowork-vmm.sudo", "params": p}, fds)
print(answer(sudo([]))["error"])
print(answer(sudo([0, 1]))["error"])
print(answer(sudo([0, 1, 2], path="true"))["error"])
print(answer(send({"method": "cowork-vmm.nope"}, [0, 1, 2]))["error"])
s = sudo([0, 1, 2], path="/bin/sleep", argv=["sleep", "1000"])
s.sendall(struct.pack(">I", 1 << 20))
print(json.dumps(answer(s)))
`

// TestChildAgentSudoRefusesBadCalls: what a hostile process sends as a
// sudo call gets an error answer, and a command whose caller sends garbage
// afterwards is killed.
func TestChildAgentSudoRefusesBadCalls(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("the probe needs /usr/bin/python3")
	}
	c := startChildAgent(t, []string{"--isolate-sessions"})
	c.setupHostSystem()
	home := t.TempDir()
	require.NoError(t, os.Chmod(home, 0o700))
	c.bind(home, "/sessions/a", false)
	require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "probe", Session: "a", UID: sessionUIDOf("a"), Command: "/usr/bin/python3", Args: []string{"-c", sudoProbe}, Cwd: "/sessions/a",
		Env: []string{"PATH=/usr/bin:/bin", "HOME=/sessions/a", testGuestRequestEnv + "=1"}}, nil))
	p := c.WaitExit("probe")
	require.NotNil(t, p.Exit.ExitCode, "%+v: %s", p.Exit, p.Stderr.String())
	require.Equal(t, 0, *p.Exit.ExitCode, p.Stderr.String())
	assert.Equal(t, "a sudo call carries exactly 3 descriptors (standard input, output and error), not 0\n"+
		"a sudo call carries exactly 3 descriptors (standard input, output and error), not 2\n"+
		`sudo: the command "true" is not an absolute path`+"\n"+
		"cowork-vmm.nope: no such method of the guest agent\n"+
		`{"success": true, "result": {"signal": 9}}`+"\n", p.Stdout.String())
}
