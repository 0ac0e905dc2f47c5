package agent

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
)

// treeOf lists everything below dir on the host, symlinks unfollowed: each
// entry's path, kind and, for a file, content.
func treeOf(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		entry := strings.TrimPrefix(p, dir) + " " + d.Type().String()
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			entry += " " + string(b)
		}
		out = append(out, entry)
		return nil
	}))
	return out
}

// mountPoints lists the mount points of the agent's mount namespace, as a
// (plain) spawn of it reads them from /proc/self/mountinfo.
func (c *testClient) mountPoints(id string) []string {
	c.t.Helper()
	c.spawn(id, "cat", "/proc/self/mountinfo")
	p := c.WaitExit(id)
	require.NotNil(c.t, p.Exit.ExitCode, p.Stderr.String())
	var points []string
	for _, line := range strings.Split(strings.TrimSpace(p.Stdout.String()), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			points = append(points, f[4])
		}
	}
	slices.Sort(points)
	return points
}

// newMountPoints is what after has that before has not.
func newMountPoints(before, after []string) []string {
	var added []string
	for _, p := range after {
		if i, found := slices.BinarySearch(before, p); found {
			before = slices.Delete(slices.Clone(before), i, i+1)
			continue
		}
		added = append(added, p)
	}
	return added
}

// sessionPair lays out two session homes below a fresh directory, as the
// agent's /sessions holds them: a (the hostile one) with an empty mnt, and
// b with files and directories at the names a aims at.
func sessionPair(t *testing.T) (a, b string) {
	t.Helper()
	sessions := filepath.Join(t.TempDir(), "sessions")
	a, b = filepath.Join(sessions, "a"), filepath.Join(sessions, "b")
	for _, d := range []string{filepath.Join(a, "mnt"), filepath.Join(b, "mnt", "work"), filepath.Join(b, ".config")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	for name, content := range map[string]string{"secret": "b's secret\n", ".gitconfig": "b's config\n", "mnt/work/keep": "b's work\n"} {
		require.NoError(t, os.WriteFile(filepath.Join(b, name), []byte(content), 0o644))
	}
	return a, b
}

// TestChildAgentMountRefusesPlantedSymlinks: a symlink a session's process
// planted on the way to one of its mount points — the last component or
// one before it; to the other session's home, into it, to / or through
// /proc; for a directory, tmpfs or single-file mount — makes the mount
// fail with an error naming the symlink, and nothing is mounted or created
// anywhere (the other home and the agent's mount table are as they were).
// Without the symlinks the same mounts land where they were meant to.
func TestChildAgentMountRefusesPlantedSymlinks(t *testing.T) {
	c := startChildAgent(t, nil)
	a, b := sessionPair(t)
	share, sdk := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(share, "planted"), []byte("a's share\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(sdk, "gitconfig"), []byte("a's config\n"), 0o644))
	escape := "cowork-escape-" + filepath.Base(filepath.Dir(filepath.Dir(a)))
	bind := func(target string) protocol.Mount {
		return protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindBind, Path: share}, Target: target}
	}
	file := func(target string) protocol.Mount {
		return protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindBind, Path: sdk}, SourceFile: "gitconfig", Target: target, ReadOnly: true}
	}
	tmpfs := protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindTmpfs}, Target: filepath.Join(a, "mnt", "scratch")}
	for i, tc := range []struct {
		name     string
		link, to string // the planted symlink (below a) and where it points
		mount    protocol.Mount
	}{
		{"last component to the other home", "mnt/work", b, bind(filepath.Join(a, "mnt", "work"))},
		{"last component into the other home", "mnt/work", filepath.Join(b, "mnt", "work"), bind(filepath.Join(a, "mnt", "work"))},
		{"last component, relative", "mnt/work", "../../b", bind(filepath.Join(a, "mnt", "work"))},
		{"last component to /", "mnt/work", "/", bind(filepath.Join(a, "mnt", "work"))},
		{"last component through /proc", "mnt/work", "/proc/self/root", bind(filepath.Join(a, "mnt", "work"))},
		{"intermediate to the other mnt", "mnt", filepath.Join(b, "mnt"), bind(filepath.Join(a, "mnt", "work"))},
		{"intermediate to the other home, missing below", "deep", b, bind(filepath.Join(a, "deep", "x", "y"))},
		{"intermediate to /", "up", "/", bind(filepath.Join(a, "up", escape, "x"))},
		{"tmpfs on a symlink", "mnt/scratch", b, tmpfs},
		{"file mount on a symlink", ".gitconfig", filepath.Join(b, ".gitconfig"), file(filepath.Join(a, ".gitconfig"))},
		{"file mount below a symlink", ".config", filepath.Join(b, ".config"), file(filepath.Join(a, ".config", "app", "conf"))},
		{"file mount below a symlink to /", "up", "/", file(filepath.Join(a, "up", escape))},
	} {
		before, mountsBefore := treeOf(t, b), c.mountPoints(fmt.Sprintf("before-%d", i))
		link := filepath.Join(a, tc.link)
		if tc.link == "mnt" {
			require.NoError(t, os.Rename(link, link+".real"))
		}
		require.NoError(t, os.Symlink(tc.to, link), tc.name)
		err := c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: tc.mount}, nil)
		assert.ErrorContains(t, err, link+" is a symbolic link", tc.name)
		assert.Equal(t, before, treeOf(t, b), "%s: the other home changed", tc.name)
		assert.Empty(t, newMountPoints(mountsBefore, c.mountPoints(fmt.Sprintf("after-%d", i))), "%s: something was mounted", tc.name)
		assert.NoFileExists(t, "/"+escape, tc.name)
		require.NoError(t, os.Remove(link))
		if tc.link == "mnt" {
			require.NoError(t, os.Rename(link+".real", link))
		}
	}

	// The same mounts, no symlinks in the way.
	for _, mt := range []protocol.Mount{bind(filepath.Join(a, "mnt", "work")), bind(filepath.Join(a, "deep", "x", "y")), tmpfs,
		file(filepath.Join(a, ".gitconfig")), file(filepath.Join(a, ".config", "app", "conf"))} {
		require.NoError(t, c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: mt}, nil), mt.Target)
	}
	c.spawn("landed", "sh", "-c", "cd "+a+" && cat mnt/work/planted deep/x/y/planted .gitconfig .config/app/conf && ls -A mnt/scratch && cd "+b+" && cat secret .gitconfig mnt/work/keep")
	p := c.WaitExit("landed")
	assert.Equal(t, "a's share\na's share\na's config\na's config\nb's secret\nb's config\nb's work\n", p.Stdout.String(), p.Stderr.String())
}

// TestChildAgentMountSwappedDuringTheWalk: while mounts are made, a racing
// goroutine swaps (rename RENAME_EXCHANGE) a session's real directories
// with symlinks to the other session's mnt and home, many times over —
// an intermediate component (a fresh mount point below it each round) and
// the last one (the same mount point, its mount replaced each round).
// Every mount either lands in the session's own tree or fails naming a
// symlink; the other home is unchanged on disk and nothing is mounted in
// it or anywhere outside the session's tree.
func TestChildAgentMountSwappedDuringTheWalk(t *testing.T) {
	c := startChildAgent(t, nil)
	a, b := sessionPair(t)
	shares := [2]string{t.TempDir(), t.TempDir()}
	for i, s := range shares {
		require.NoError(t, os.WriteFile(filepath.Join(s, "which"), []byte(fmt.Sprintf("share %d\n", i)), 0o644))
	}
	swapped := map[string]string{"work": filepath.Join(b, "mnt"), "final": b}
	for name, to := range swapped {
		require.NoError(t, os.Mkdir(filepath.Join(a, "mnt", name), 0o755))
		require.NoError(t, os.Symlink(to, filepath.Join(a, "mnt", name+"-evil")))
	}
	before, mountsBefore := treeOf(t, b), c.mountPoints("before")

	stop := make(chan struct{})
	var swaps atomic.Int64
	var wg sync.WaitGroup
	for name := range swapped {
		wg.Add(1)
		go func() {
			defer wg.Done()
			real, evil := filepath.Join(a, "mnt", name), filepath.Join(a, "mnt", name+"-evil")
			for {
				select {
				case <-stop:
					return
				default:
				}
				if unix.Renameat2(unix.AT_FDCWD, real, unix.AT_FDCWD, evil, unix.RENAME_EXCHANGE) == nil {
					swaps.Add(1)
				}
			}
		}()
	}
	const rounds = 300
	var landed, refused int
	count := func(err error) {
		if err == nil {
			landed++
			return
		}
		refused++
		assert.ErrorContains(t, err, " is a symbolic link")
	}
	for i := range rounds {
		count(c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
			Source: protocol.MountSource{Kind: protocol.MountKindBind, Path: shares[0]}, Target: filepath.Join(a, "mnt", "work", fmt.Sprintf("m%d", i), "in")}}, nil))
		count(c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
			Source: protocol.MountSource{Kind: protocol.MountKindBind, Path: shares[i%2]}, Target: filepath.Join(a, "mnt", "final")}}, nil))
	}
	close(stop)
	wg.Wait()
	t.Logf("%d mounts landed, %d refused, %d swaps", landed, refused, swaps.Load())
	assert.Positive(t, landed, "some mounts got through the race")
	assert.Positive(t, refused, "some walks met a symlink")

	assert.Equal(t, before, treeOf(t, b), "the other home changed on disk")
	added := newMountPoints(mountsBefore, c.mountPoints("after"))
	assert.NotEmpty(t, added)
	for _, p := range added {
		assert.True(t, strings.HasPrefix(p, a+"/"), "a mount landed at %s, outside the session's tree", p)
	}
	// Settled, the mount point takes the next mount as asked.
	final := filepath.Join(a, "mnt", "final")
	if st, err := os.Lstat(final); err == nil && st.Mode()&os.ModeSymlink != 0 {
		require.NoError(t, unix.Renameat2(unix.AT_FDCWD, final, unix.AT_FDCWD, final+"-evil", unix.RENAME_EXCHANGE))
	}
	for i := range 2 {
		require.NoError(t, c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
			Source: protocol.MountSource{Kind: protocol.MountKindBind, Path: shares[i]}, Target: final}}, nil))
		id := fmt.Sprintf("settled-%d", i)
		c.spawn(id, "cat", filepath.Join(final, "which"))
		assert.Equal(t, fmt.Sprintf("share %d\n", i), c.WaitExit(id).Stdout.String())
	}
}

// TestChildAgentIsolatedSessionCannotSteerAMount runs the agent as the VM
// does (--isolate-sessions): a process of session a plants symlinks in its
// own home where the helper will mount for it — to session b's home, into
// it, to / — and the mounts are refused; b's process finds its home as it
// was and nothing mounted in it; the home of a takes the mounts once the
// symlinks are gone.
func TestChildAgentIsolatedSessionCannotSteerAMount(t *testing.T) {
	c := startChildAgent(t, []string{"--isolate-sessions"})
	c.setupHostSystem()
	homeA, homeB, share := t.TempDir(), t.TempDir(), t.TempDir()
	for _, home := range []string{homeA, homeB} {
		require.NoError(t, os.Chmod(home, 0o700))
	}
	require.NoError(t, os.Mkdir(filepath.Join(homeB, "mnt"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(homeB, "secret"), []byte("b's\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(share, "f"), []byte("a's share\n"), 0o644))
	c.bind(homeA, "/sessions/a", false)
	c.bind(homeB, "/sessions/b", false)
	spawnIn := func(id, session, script string) *agenttest.Output {
		t.Helper()
		require.NoError(t, c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
			ID: id, Session: session, UID: sessionUIDOf(session), Command: "/bin/sh", Args: []string{"-c", script}, Cwd: "/sessions/" + session,
			Env: []string{"PATH=/usr/bin:/bin", "HOME=/sessions/" + session},
		}, nil))
		p := c.WaitExit(id)
		require.NotNil(t, p.Exit.ExitCode, p.Stderr.String())
		require.Equal(t, 0, *p.Exit.ExitCode, p.Stderr.String())
		return p
	}
	spawnIn("plant", "a", "mkdir -p /sessions/a/mnt && ln -s /sessions/b /sessions/a/mnt/work && "+
		"ln -s /sessions/b/mnt /sessions/a/deep && ln -s / /sessions/a/up && ln -s /sessions/b/secret /sessions/a/.gitconfig")
	targets := map[string]string{
		"/sessions/a/mnt/work": "/sessions/a/mnt/work", "/sessions/a/deep/x": "/sessions/a/deep",
		"/sessions/a/up/sessions/b": "/sessions/a/up", "/sessions/a/.gitconfig": "/sessions/a/.gitconfig",
	}
	for target, link := range targets {
		mt := protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindBind, Path: share}, Target: target}
		if strings.HasSuffix(target, ".gitconfig") {
			mt.SourceFile, mt.Source.Path = "f", share
		}
		err := c.Call(protocol.AgentMethodMount, protocol.MountParams{Mount: mt}, nil)
		assert.ErrorContains(t, err, link+" is a symbolic link", target)
	}
	p := spawnIn("check", "b", "ls -A /sessions/b /sessions/b/mnt; cat /sessions/b/secret; grep -c ' /sessions/b[/ ]' /proc/self/mountinfo")
	assert.Equal(t, "/sessions/b:\nmnt\nsecret\n\n/sessions/b/mnt:\nb's\n1\n", p.Stdout.String(), "b's home and its one mount (itself)")

	spawnIn("unplant", "a", "rm /sessions/a/mnt/work /sessions/a/deep /sessions/a/up /sessions/a/.gitconfig")
	c.bind(share, "/sessions/a/mnt/work", true)
	p = spawnIn("use", "a", "cat /sessions/a/mnt/work/f")
	assert.Equal(t, "a's share\n", p.Stdout.String())
}
