package agent

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/egress/fdpass"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
)

// isolationProbe is the hostile spawn of TestChildAgentIsolatesSessions
// (and of the e2e isolation tests, which read the same file).
//
//go:embed testdata/isolation_probe.py
var isolationProbe string

// TestSpawnRootPlan: an isolated spawn's root binds the system directories
// and the other mounts outside /sessions once each (what lies below a bind
// comes with it), and of /sessions only its own session's home.
func TestSpawnRootPlan(t *testing.T) {
	system := []string{"/usr", "/bin", "/etc", "/lib"}
	mounted := []string{
		"/usr", "/usr/local/bin/claude", // the SDK, inside a system directory
		"/work", "/data/hosts", // `run --mount`
		"/sessions/a", "/sessions/a/mnt/work", "/sessions/a/mnt/.claude/skills",
		"/sessions/b", "/sessions/b/mnt/secret", "/sessions", "/sessions/ab",
		"/proc/x", "/sys/y", "/tmp/shared",
	}
	assert.Equal(t, []string{"/bin", "/data/hosts", "/etc", "/lib", "/tmp/shared", "/usr", "/work", "/sessions/a"},
		planRoot(system, mounted, "a"))
	assert.Equal(t, []string{"/bin", "/data/hosts", "/etc", "/lib", "/tmp/shared", "/usr", "/work"},
		planRoot(system, mounted, ""), "a spawn of no session sees no session")
	assert.Equal(t, []string{"/"}, planRoot([]string{"/"}, []string{"/x"}, "")[:1], "a bind of / covers everything")
}

// TestSpawnIdentity: every spawn of a session gets the session's uid (and
// gid) the helper chose — a session uid, the same for every spawn of the
// session, no other session's; its user namespace maps that id and the
// owners of its files, each to itself; its capabilities are the three that
// open files, nothing over ids, processes or mounts.
func TestSpawnIdentity(t *testing.T) {
	var uids sessionUIDs
	helper := owner{1000, 1000}
	a := uint32(protocol.FirstSessionUID)
	require.NoError(t, uids.claim("a", a))
	require.NoError(t, uids.claim("a", a), "the same session, the same uid")
	b := a + 1
	require.NoError(t, uids.claim("b", b))
	assert.ErrorContains(t, uids.claim("a", a+2), "runs as uid", "a session keeps its uid")
	assert.ErrorContains(t, uids.claim("c", a), "is session \"a\"'s", "no two sessions share a uid")
	assert.ErrorContains(t, uids.claim("d", 0), "not a session uid", "never 0")
	assert.ErrorContains(t, uids.claim("d", 1000), "not a session uid", "nor a system user's")

	id := identityFor(a, []owner{{0, 0}, helper, {1000, 27}, {a, a}})
	assert.Equal(t, a, id.uid)
	assert.Equal(t, a, id.gid)
	one := func(n int) syscall.SysProcIDMap { return syscall.SysProcIDMap{ContainerID: n, HostID: n, Size: 1} }
	assert.Equal(t, []syscall.SysProcIDMap{one(int(a)), one(0), one(1000)}, id.uidMap)
	assert.Equal(t, []syscall.SysProcIDMap{one(int(a)), one(0), one(1000), one(27)}, id.gidMap)

	var many []owner
	for i := range 3 * maxMappedOwners {
		many = append(many, owner{uint32(2000 + i), uint32(3000 + i)})
	}
	id = identityFor(a, many)
	assert.Len(t, id.uidMap, maxMappedOwners+1)
	assert.Len(t, id.gidMap, maxMappedOwners+1)

	attr := (&isolation{id: identityFor(b, []owner{helper})}).sysProcAttr()
	assert.Equal(t, uintptr(unix.CLONE_NEWUSER|unix.CLONE_NEWIPC), attr.Cloneflags)
	assert.True(t, attr.Setpgid)
	assert.False(t, attr.GidMappingsEnableSetgroups, "setgroups is denied in the spawn's user namespace")
	assert.Equal(t, &syscall.Credential{Uid: b, Gid: b, NoSetGroups: true}, attr.Credential)
	assert.ElementsMatch(t, []uintptr{unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER}, attr.AmbientCaps)
	for _, c := range []uintptr{unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_SYS_ADMIN, unix.CAP_SYS_PTRACE, unix.CAP_CHOWN, unix.CAP_KILL} {
		assert.NotContains(t, attr.AmbientCaps, c)
	}
}

func TestWithUser(t *testing.T) {
	assert.Equal(t, "root:x:0:0\ncowork:x:1\n", string(withUser([]byte("root:x:0:0"), "cowork:x:1\n")))
	assert.Equal(t, "root:x:0:0\ncowork:x:1\n", string(withUser([]byte("root:x:0:0\n"), "cowork:x:1\n")))
	assert.Equal(t, "cowork:x:1\n", string(withUser(nil, "cowork:x:1\n")))
}

// probeResult runs the probe's output line through JSON.
func probeResult(t *testing.T, stdout string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(stdout, "\n") {
		if raw, ok := strings.CutPrefix(line, "PROBE "); ok {
			var r map[string]any
			require.NoError(t, json.Unmarshal([]byte(raw), &r))
			return r
		}
	}
	t.Fatalf("no PROBE line in the probe's output:\n%s", stdout)
	return nil
}

// TestChildAgentIsolatesSessions runs the agent as the VM does (real root,
// --isolate-sessions) in a re-executed test binary and two sessions in it:
// a spawn of one cannot reach the agent, the other session or the other
// session's spawn, cannot mount 9p, still makes user namespaces, and uses
// its own session's files and mounts; mounts added to its session later
// reach it, a session added later does not.
func TestChildAgentIsolatesSessions(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("the probe needs /usr/bin/python3")
	}
	egressEnd, egress := startEgressStub(t)
	c := startChildAgent(t, []string{"--isolate-sessions", "--egress-fd", "4"}, egressEnd)
	c.setupHostSystem()
	bind := c.bind
	homeA, homeB, work, ro, late := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	for _, home := range []string{homeA, homeB} {
		require.NoError(t, os.Chmod(home, 0o700)) // as the helper makes them
	}
	require.NoError(t, os.WriteFile(filepath.Join(homeB, "secret"), []byte("b's\n"), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(homeA, "bin"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(homeA, "bin", "hello"), []byte("#!/bin/sh\necho \"hello $* from $(pwd)\"\n"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(late, "f"), []byte("late mount\n"), 0o644))
	bind(homeA, "/sessions/a", false)
	bind(homeB, "/sessions/b", false)
	bind(work, "/sessions/a/mnt/work", false)
	bind(ro, "/sessions/a/mnt/ro", true)
	spawnIn := func(id, session string, args ...string) {
		t.Helper()
		require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
			ID: id, Session: session, UID: sessionUIDOf(session), Command: args[0], Args: args[1:], Cwd: "/sessions/" + session,
			Env: []string{"PATH=/usr/bin:/bin", "HOME=/sessions/" + session, "USER=cowork"}, EgressToken: "tok-" + id,
		}, nil))
	}

	spawnIn("victim", "b", "/bin/sh", "-c", `echo "$$ $(id -u)" > /sessions/b/victim; echo ready; exec sleep 1000`)
	c.WaitFor("victim", "ready", func(p *agenttest.Output) bool { return strings.Contains(p.Stdout.String(), "ready") || p.Exit != nil })
	victim, err := os.ReadFile(filepath.Join(homeB, "victim"))
	require.NoError(t, err)
	var victimPID, victimUID int
	_, err = fmt.Sscan(string(victim), &victimPID, &victimUID)
	require.NoError(t, err)

	args, err := json.Marshal(map[string]any{"own": "a", "other": "b", "victimPid": victimPID, "otherFile": "secret",
		"rw": "/sessions/a/mnt/work", "ro": "/sessions/a/mnt/ro", "url": "http://somewhere.test/"})
	require.NoError(t, err)
	spawnIn("probe", "a", "/usr/bin/python3", "-c", isolationProbe, string(args))
	p := c.WaitExit("probe")
	require.NotNil(t, p.Exit.ExitCode, "probe %+v: %s", p.Exit, p.Stderr.String())
	require.Equal(t, 0, *p.Exit.ExitCode, p.Stderr.String())
	r := probeResult(t, p.Stdout.String())
	t.Logf("probe: %v", r)

	uid := assertIsolatedProbe(t, r, victimUID)
	// Its traffic went through its proxy, which presented its token.
	assert.Contains(t, r["curl"], "blocked-by-allowlist: somewhere.test")
	assert.Contains(t, egress.seen(), protocol.EgressRequest{SpawnID: "probe", Token: "tok-probe", Host: "somewhere.test", Port: 80})
	got, err := os.ReadFile(filepath.Join(work, "from-probe.txt"))
	require.NoError(t, err)
	assert.Equal(t, "probe\n", string(got))
	st, err := os.Stat(filepath.Join(homeA, "probe.txt"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm())

	// A mount added below a running spawn's session reaches it; a session
	// mounted after it started does not.
	spawnIn("late", "a", "/bin/sh", "-c", `echo ready; while [ ! -e /sessions/a/mnt/late/f ]; do sleep 0.02; done; cat /sessions/a/mnt/late/f; ls /sessions`)
	c.WaitFor("late", "ready", func(p *agenttest.Output) bool { return strings.Contains(p.Stdout.String(), "ready") || p.Exit != nil })
	bind(t.TempDir(), "/sessions/c", false)
	bind(late, "/sessions/a/mnt/late", true)
	p = c.WaitExit("late")
	assert.Equal(t, "ready\nlate mount\na\n", p.Stdout.String(), p.Stderr.String())

	// A command and a working directory inside the (0700) session home,
	// which the child cannot reach before its exec gives it capabilities.
	require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "inside", Session: "a", UID: sessionUIDOf("a"), Command: "/sessions/a/bin/hello", Args: []string{"x", "y"}, Cwd: "/sessions/a/bin",
		Env: []string{"PATH=/usr/bin:/bin", "HOME=/sessions/a"},
	}, nil))
	p = c.WaitExit("inside")
	assert.Equal(t, "hello x y from /sessions/a/bin\n", p.Stdout.String(), p.Stderr.String())
	// A working directory the agent has but the spawn's root has not.
	err = c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "elsewhere", Session: "a", UID: sessionUIDOf("a"), Command: "/bin/true", Cwd: hostRootDir, Env: []string{"HOME=/sessions/a"},
	}, nil)
	assert.ErrorContains(t, err, "working directory "+hostRootDir)
	// No session named: refused, not guessed from the working directory.
	err = c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: "nameless", Command: "/bin/true", Cwd: "/sessions/a", Env: []string{"HOME=/sessions/a"},
	}, nil)
	assert.ErrorContains(t, err, "no session given")

	// Spawns of one session share its uid.
	spawnIn("again", "a", "/usr/bin/id", "-u")
	p = c.WaitExit("again")
	assert.Equal(t, strconv.Itoa(uid)+"\n", p.Stdout.String())

	// A system directory that is a symlink on the host is one in the
	// spawn's root too (setup's symlink mounts, copied into each root).
	if link, err := os.Readlink("/bin"); err == nil {
		spawnIn("binlink", "a", "/usr/bin/readlink", "/bin")
		p = c.WaitExit("binlink")
		assert.Equal(t, link+"\n", p.Stdout.String(), p.Stderr.String())
	}

	require.NoError(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "victim", Signal: "SIGKILL"}, nil))
	c.WaitExit("victim")
	assert.True(t, slices.Contains([]string{"ENOENT", "EACCES", "EPERM"}, r["agentMem"].(string)), "agentMem %v", r["agentMem"])
}

// setupHostSystem sets the agent's root up with the host's system
// directories, read-only, as the helper does.
func (c *testClient) setupHostSystem() {
	c.t.Helper()
	var system []protocol.Mount
	for _, d := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"} {
		if link, err := os.Readlink(d); err == nil { // merged /usr: the helper sends a symlink
			system = append(system, protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindSymlink, Path: link}, Target: d, ReadOnly: true})
		} else if _, err := os.Lstat(d); err == nil {
			system = append(system, protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindBind, Path: d}, Target: d, ReadOnly: true})
		}
	}
	require.NoError(c.t, c.Call(protocol.AgentMethodSetup, protocol.SetupParams{NewRoot: true, System: system}, nil))
}

// bind mounts the host path src at target.
func (c *testClient) bind(src, target string, ro bool) {
	c.t.Helper()
	require.NoError(c.t, c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
		Source: protocol.MountSource{Kind: protocol.MountKindBind, Path: src}, Target: target, ReadOnly: ro}}, nil))
}

// assertIsolatedProbe checks what the isolation probe of session a found
// (TestChildAgentIsolatesSessions) and returns its uid.
func assertIsolatedProbe(t *testing.T, r map[string]any, victimUID int) int {
	t.Helper()
	for _, k := range []string{"agentPtrace", "agentMem", "agentEnviron", "agentFd", "agentRoot",
		"otherSession", "otherFile", "victimPtrace", "victimEnviron", "victimRoot", "victimSignal"} {
		assert.NotEqual(t, "ok", r[k], "%s must be refused", k)
	}
	assert.Equal(t, "EPERM", r["agentPtrace"])
	assert.Equal(t, "EPERM", r["victimSignal"], "another session's process is another uid")
	assert.Equal(t, []any{"a"}, r["sessions"], "only its own session is in /sessions")
	assert.Equal(t, "ENOENT", r["otherSession"])
	assert.Equal(t, []any{"EPERM"}, r["mount9p"])
	assert.Equal(t, "ok", r["nestedUserns"], "user namespaces still work (bubblewrap)")
	assert.Equal(t, "ok", r["nestedTmpfs"])
	// EPERM where the kernel has 9p (the VM), ENODEV where it has not.
	assert.Contains(t, []any{"EPERM", "ENODEV"}, r["nestedMount9p"], "9p cannot be mounted from a user namespace")
	assert.Equal(t, []any{"EPERM"}, r["mountVirtioFS"])
	assert.Contains(t, []any{"EPERM", "ENODEV"}, r["nestedMountVirtioFS"], "virtiofs cannot be mounted from a user namespace")
	uid := int(r["uid"].(float64))
	assert.GreaterOrEqual(t, uid, protocol.FirstSessionUID)
	assert.NotEqual(t, victimUID, uid, "two sessions, two uids")
	assert.Equal(t, spawnUserName, r["user"], "its uid has a passwd entry")
	for _, k := range []string{"ownWrite", "ownRead", "ownChmod", "stdout", "rwWrite"} {
		assert.Equal(t, "ok", r[k], k)
	}
	assert.Equal(t, "EROFS", r["roWrite"])
	for _, k := range r["envKeys"].([]any) {
		assert.NotContains(t, strings.ToUpper(k.(string)), "TOKEN", "no token in the spawn's environment")
	}
	return uid
}

// startEgressStub makes the helper's end of a child agent's --egress-fd
// (the agent's end, returned, is to be passed to it): a refusingDialer
// serves every connection the agent passes over it.
func startEgressStub(t *testing.T) (agentEnd *os.File, helper *refusingDialer) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	agentEnd = os.NewFile(uintptr(fds[0]), "egress-agent-end")
	t.Cleanup(func() { agentEnd.Close() })
	l := fdpass.NewListener(fileConn(t, fds[1]).(*net.UnixConn))
	t.Cleanup(func() { l.Close() })
	helper = &refusingDialer{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go helper.refuse(c)
		}
	}()
	return agentEnd, helper
}

// sessionUIDOf is the uid a test gives session's spawns, a session uid of
// its own per name, as the helper gives them.
func sessionUIDOf(session string) uint32 {
	return protocol.FirstSessionUID + crc32.ChecksumIEEE([]byte(session))%protocol.MaxSessionUIDs
}
