package helper

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// sharedCount counts how often host was shared with the guest.
func sharedCount(g *fakeGuest, host string) int {
	shared, _ := g.shareState()
	n := 0
	for _, p := range shared {
		if p == host {
			n++
		}
	}
	return n
}

// TestSpawnFreshVersusResume: a spawn without isResume finds only its own
// mounts in its session (the earlier spawn's are unmounted and withdrawn,
// not forgotten: readFile and a later resume make them again); with
// isResume it finds the earlier ones too; the home's files persist either
// way.
func TestSpawnFreshVersusResume(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	work := t.TempDir()
	mounts := map[string]any{"work": map[string]string{"path": rel(work), "mode": "rw"}}
	e.spawn(map[string]any{"id": "first", "name": "s", "command": "sh", "additionalMounts": mounts})
	home := filepath.Join(e.s.sessionsDir, "s")
	require.NoError(t, os.WriteFile(filepath.Join(home, "transcript"), []byte("turn 1\n"), 0o600))
	g.agent.exit("first", 0)
	e.next(protocol.EventExit)
	waitUnshares(t, g, 2) // its home and work, withdrawn

	e.spawn(map[string]any{"id": "resumed", "name": "s", "command": "sh", "isResume": true})
	assert.Equal(t, 2, sharedCount(g, work), "the earlier spawn's mount is made again")
	_, ok := g.agent.mountAt("/sessions/s/mnt/work")
	assert.True(t, ok)
	assert.Empty(t, g.agent.unmounted())
	g.agent.exit("resumed", 0)
	e.next(protocol.EventExit)

	unshared := len(waitUnshares(t, g, 4)) // resumed's exit withdrew both again
	e.spawn(map[string]any{"id": "fresh", "name": "s", "command": "sh"})
	assert.Equal(t, []string{"/sessions/s/mnt/work"}, g.agent.unmounted(), "a fresh start unmounts what it did not ask for")
	_, ok = g.agent.mountAt("/sessions/s/mnt/work")
	assert.False(t, ok)
	assert.Equal(t, 2, sharedCount(g, work), "and does not share it again")
	assertNoMoreUnshares(t, g, unshared) // withdrawn already
	b, err := os.ReadFile(filepath.Join(home, "transcript"))
	require.NoError(t, err)
	assert.Equal(t, "turn 1\n", string(b), "the home persists")

	// Not forgotten: readFile reads through it, made again.
	g.agent.mu.Lock()
	g.agent.files["/sessions/s/mnt/work/out"] = []byte("out\n")
	g.agent.mu.Unlock()
	var r protocol.ClientReadFileResult
	e.mustCall("readFile", map[string]any{"processName": "s", "filePath": "/sessions/s/mnt/work/out"}, &r)
	assert.Equal(t, "out\n", string(r.Content))
	assert.Equal(t, 3, sharedCount(g, work))
	g.agent.exit("fresh", 0)
	e.next(protocol.EventExit)

	e.spawn(map[string]any{"id": "resumed-again", "name": "s", "command": "sh", "isResume": true})
	_, ok = g.agent.mountAt("/sessions/s/mnt/work")
	assert.True(t, ok, "a later resume brings it back")
}

// TestSpawnFreshLeavesARunningSessionAlone: a fresh spawn in a session
// whose other process still runs unmounts nothing under it.
func TestSpawnFreshLeavesARunningSessionAlone(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	work := t.TempDir()
	e.spawn(map[string]any{"id": "running", "name": "s", "command": "sh",
		"additionalMounts": map[string]any{"work": map[string]string{"path": rel(work)}}})
	e.spawn(map[string]any{"id": "fresh", "name": "s", "command": "sh"})
	assert.Empty(t, g.agent.unmounted())
	_, ok := g.agent.mountAt("/sessions/s/mnt/work")
	assert.True(t, ok)
}

// TestOneShotReleasesItsSession: when a oneShot process ends as its
// session's last, the session's mounts, its home's too, are unmounted and
// forgotten (a resume finds none); an ordinary exit keeps them withdrawn.
func TestOneShotReleasesItsSession(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	work := t.TempDir()
	mounts := map[string]any{"work": map[string]string{"path": rel(work)}}
	e.spawn(map[string]any{"id": "once", "name": "s", "command": "sh", "oneShot": true, "additionalMounts": mounts})
	g.agent.exit("once", 0)
	assert.Equal(t, 0, *e.next(protocol.EventExit).ExitCode)
	waitFor(t, "the session's mounts unmounted", func() bool { return len(g.agent.unmounted()) == 2 })
	assert.Equal(t, []string{"/sessions/s/mnt/work", "/sessions/s"}, g.agent.unmounted())
	e.spawn(map[string]any{"id": "resumed", "name": "s", "command": "sh", "isResume": true})
	assert.Equal(t, 1, sharedCount(g, work), "nothing left to resume")
	var r protocol.IsProcessRunningResult
	e.mustCall("isProcessRunning", map[string]any{"id": "once"}, &r)
	assert.Equal(t, protocol.IsProcessRunningResult{ExitCode: ptr(0)}, r, "its exit is still known")

	// A oneShot process ending while another of its session runs leaves it.
	e.spawn(map[string]any{"id": "once-more", "name": "s", "command": "sh", "oneShot": true})
	g.agent.exit("once-more", 0)
	e.next(protocol.EventExit)
	assertNoMoreUnshares(t, g, 2) // the first release's two
	assert.Len(t, g.agent.unmounted(), 2)
}

// TestSkeletonHome: mountSkeletonHome copies /etc/skel's files and
// directories into the home where it lacks them (no symlink, no set-id
// bit, nothing overwritten, no write through a symlink the guest planted)
// and mounts the configuration entries of additionalMounts in the home as
// well, read-only as asked; without it neither happens.
func TestSkeletonHome(t *testing.T) {
	skel := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(skel, ".bashrc"), []byte("skel bashrc\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(skel, ".profile"), []byte("skel profile\n"), 0o4755))
	require.NoError(t, os.MkdirAll(filepath.Join(skel, ".config", "app"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(skel, ".config", "app", "rc"), []byte("skel rc\n"), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(skel, ".local"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(skel, ".local", "x"), []byte("skel x\n"), 0o600))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(skel, ".link")))
	old := skelDir
	skelDir = skel
	t.Cleanup(func() { skelDir = old })

	e := newTestEnv(t)
	g := e.start()
	home := filepath.Join(e.s.sessionsDir, "s")
	require.NoError(t, os.MkdirAll(home, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(home, ".bashrc"), []byte("the user's\n"), 0o600))
	outside := t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(home, ".local"))) // planted by the guest
	skills, work := t.TempDir(), t.TempDir()
	e.spawn(map[string]any{"id": "p", "name": "s", "command": "sh", "mountSkeletonHome": true, "additionalMounts": map[string]any{
		".claude/skills": map[string]string{"path": rel(skills), "mode": "ro"},
		"work":           map[string]string{"path": rel(work), "mode": "rw"},
	}})

	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(home, name))
		require.NoError(t, err, name)
		return string(b)
	}
	assert.Equal(t, "the user's\n", read(".bashrc"), "nothing overwritten")
	assert.Equal(t, "skel profile\n", read(".profile"))
	assert.Equal(t, "skel rc\n", read(".config/app/rc"))
	st, err := os.Stat(filepath.Join(home, ".profile"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode()&(os.ModePerm|os.ModeSetuid), "no set-id bit")
	_, err = os.Lstat(filepath.Join(home, ".link"))
	assert.ErrorIs(t, err, os.ErrNotExist, "symlinks are not copied")
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written through the planted symlink")

	m, ok := g.agent.mountAt("/sessions/s/.claude/skills")
	require.True(t, ok, "the configuration mount is in the home")
	assert.True(t, m.ReadOnly)
	assert.Equal(t, skills, m.Source.Path)
	m, ok = g.agent.mountAt("/sessions/s/mnt/.claude/skills")
	require.True(t, ok, "and where additionalMounts puts it")
	assert.True(t, m.ReadOnly)
	_, ok = g.agent.mountAt("/sessions/s/work")
	assert.False(t, ok, "not a configuration entry")
	g.agent.exit("p", 0)
	e.next(protocol.EventExit)

	e.spawn(map[string]any{"id": "plain", "name": "t", "command": "sh", "additionalMounts": map[string]any{
		".claude/skills": map[string]string{"path": rel(skills), "mode": "ro"},
	}})
	_, ok = g.agent.mountAt("/sessions/t/.claude/skills")
	assert.False(t, ok, "without mountSkeletonHome")
	_, err = os.Stat(filepath.Join(e.s.sessionsDir, "t", ".profile"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestSpawnMountKinds(t *testing.T) {
	for _, c := range []struct {
		target string
		spawn  bool
	}{
		{"/sessions/s/mnt/work", true}, {"/sessions/s/.claude/skills", true}, {"/sessions/s/.gitconfig", true},
		{"/sessions/s", false}, {"/sessions/s/data", false}, {"/sessions/t/mnt/x", false}, {"/sessions/s/mntx", false},
	} {
		assert.Equal(t, c.spawn, isSpawnMount("s", c.target), c.target)
	}
	assert.True(t, isConfigMount(".claude"))
	assert.False(t, isConfigMount("claude/.x"))
	assert.True(t, isConfigMount(".config/gh"))
}
