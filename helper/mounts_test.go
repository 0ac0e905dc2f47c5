package helper

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Issue #15: exports were never withdrawn, and a single-file mount shared
// its whole directory. These tests drive the helper with the fake backend
// and check what it shares and withdraws.

func bind(path string) protocol.MountSource { return protocol.MountSource{Kind: "bind", Path: path} }

// waitUnshares waits until the guest has withdrawn n sources and returns
// them.
func waitUnshares(t *testing.T, g *fakeGuest, n int) []protocol.MountSource {
	t.Helper()
	var got []protocol.MountSource
	waitFor(t, "withdrawals", func() bool {
		_, got = g.shareState()
		return len(got) >= n
	})
	return got
}

// assertNoMoreUnshares checks that the guest's withdrawals stay at n
// (withdrawals after an exit run asynchronously: give them a moment).
func assertNoMoreUnshares(t *testing.T, g *fakeGuest, n int) {
	t.Helper()
	time.Sleep(50 * time.Millisecond)
	_, got := g.shareState()
	assert.Len(t, got, n, "withdrawn: %v", got)
}

func rel(path string) string { return strings.TrimPrefix(path, "/") }

func TestFileMountSharesOnlyTheFile(t *testing.T) {
	e := newTestEnv(t)
	home := t.TempDir()
	gitconfig := filepath.Join(home, ".gitconfig")
	require.NoError(t, os.WriteFile(gitconfig, []byte("[user]"), 0o600))
	sdkRoot := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(sdkRoot, "1.0.0"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sdkRoot, "1.0.0", "claude"), []byte("#!/bin/sh\n"), 0o755))
	e.mustCall("installSdk", map[string]any{"sdkSubpath": rel(sdkRoot), "version": "1.0.0"}, nil)
	g := e.start()

	e.spawn(map[string]any{"id": "p1", "name": "s", "command": "sh",
		"additionalMounts": map[string]any{".gitconfig": map[string]string{"path": rel(gitconfig), "mode": "rw"}}})
	shared, _ := g.shareState()
	assert.Contains(t, shared, gitconfig, "the file itself is shared")
	assert.Contains(t, shared, filepath.Join(sdkRoot, "1.0.0", "claude"), "the SDK binary itself is shared")
	assert.NotContains(t, shared, home, "never the directory holding it")
	assert.NotContains(t, shared, filepath.Join(sdkRoot, "1.0.0"))
	m, ok := g.agent.mountAt("/sessions/s/mnt/.gitconfig")
	require.True(t, ok)
	assert.Equal(t, ".gitconfig", m.SourceFile, "the agent binds the file by name out of the source")
	assert.False(t, m.ReadOnly)
}

// A mount replaced at its target (another source, or rw → ro) withdraws
// the old source once the agent has replaced it.
func TestRemountWithdrawsTheReplacedSource(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	work, other := t.TempDir(), t.TempDir()
	e.spawn(map[string]any{"id": "p1", "name": "s", "command": "sh",
		"additionalMounts": map[string]any{"work": map[string]string{"path": rel(work), "mode": "rw"}}})
	_, unshared := g.shareState()
	require.Empty(t, unshared)

	// The same spec again: nothing shared or withdrawn.
	before, _ := g.shareState()
	e.mustCall("mountPath", map[string]any{"processId": "p1", "subpath": rel(work), "mountName": "work", "mode": "rw"}, nil)
	after, _ := g.shareState()
	assert.Equal(t, before, after, "a repeated mount shares nothing new")

	// rw → ro: the rw source goes.
	e.mustCall("mountPath", map[string]any{"processId": "p1", "subpath": rel(work), "mountName": "work", "mode": "ro"}, nil)
	m, _ := g.agent.mountAt("/sessions/s/mnt/work")
	assert.True(t, m.ReadOnly)
	assert.Equal(t, []protocol.MountSource{bind(work)}, waitUnshares(t, g, 1))

	// Another source: the read-only one goes.
	e.mustCall("mountPath", map[string]any{"processId": "p1", "subpath": rel(other), "mountName": "work", "mode": "ro"}, nil)
	assert.Equal(t, []protocol.MountSource{bind(work), bind(work)}, waitUnshares(t, g, 2))
	assertNoMoreUnshares(t, g, 2)

	// A mount the agent refuses withdraws both the old source and the new.
	g.agent.mu.Lock()
	g.agent.mountErr = "mount failed"
	g.agent.mu.Unlock()
	require.Error(t, e.call("mountPath", map[string]any{"processId": "p1", "subpath": rel(work), "mountName": "work", "mode": "rw"}, nil))
	assert.Equal(t, []protocol.MountSource{bind(work), bind(work), bind(other), bind(work)}, waitUnshares(t, g, 4))
}

// The SDK installed again (a new version) withdraws the old binary's share.
func TestInstallSdkAgainWithdrawsTheOldBinary(t *testing.T) {
	e := newTestEnv(t)
	sdkRoot := t.TempDir()
	for _, v := range []string{"1.0.0", "2.0.0"} {
		require.NoError(t, os.MkdirAll(filepath.Join(sdkRoot, v), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(sdkRoot, v, "claude"), []byte("#!/bin/sh\n"), 0o755))
	}
	e.mustCall("installSdk", map[string]any{"sdkSubpath": rel(sdkRoot), "version": "1.0.0"}, nil)
	g := e.start()
	e.mustCall("installSdk", map[string]any{"sdkSubpath": rel(sdkRoot), "version": "2.0.0"}, nil)
	assert.Equal(t, []protocol.MountSource{bind(filepath.Join(sdkRoot, "1.0.0"))}, waitUnshares(t, g, 1))
}

// The session's last process ending withdraws its mounts (and only its);
// the next spawn mounts them afresh.
func TestLastExitWithdrawsTheSessionsMounts(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	work := t.TempDir()
	mounts := map[string]any{"work": map[string]string{"path": rel(work), "mode": "rw"}}
	e.spawn(map[string]any{"id": "a", "name": "s", "command": "sh", "additionalMounts": mounts})
	e.spawn(map[string]any{"id": "b", "name": "s", "command": "sh", "additionalMounts": mounts})
	e.spawn(map[string]any{"id": "c", "name": "t", "command": "sh"})
	home := filepath.Join(e.s.sessionsDir, "s")

	g.agent.exit("a", 0)
	e.next(protocol.EventExit)
	assertNoMoreUnshares(t, g, 0) // b still runs in s

	g.agent.exit("b", 0)
	e.next(protocol.EventExit)
	got := waitUnshares(t, g, 2)
	assert.ElementsMatch(t, []protocol.MountSource{bind(home), bind(work)}, got)
	assertNoMoreUnshares(t, g, 2) // t's home stays: c runs

	// The next spawn in s shares its home and mount again.
	shared, _ := g.shareState()
	e.spawn(map[string]any{"id": "d", "name": "s", "command": "sh", "additionalMounts": mounts})
	again, _ := g.shareState()
	assert.ElementsMatch(t, []string{home, work}, again[len(shared):], "shared afresh")
	assertNoMoreUnshares(t, g, 2)
}

// A failed spawn leaves no mount shared in an idle session.
func TestFailedSpawnWithdrawsItsMounts(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	g.agent.mu.Lock()
	g.agent.spawnErr = "exec: not found"
	g.agent.mu.Unlock()
	require.Error(t, e.call("spawn", map[string]any{"id": "p", "name": "s", "command": "nope"}, nil))
	home := filepath.Join(e.s.sessionsDir, "s")
	assert.Equal(t, []protocol.MountSource{bind(home)}, waitUnshares(t, g, 1))
}

// An exit while another spawn of the session is mounting does not withdraw
// the mounts that spawn is about to run in.
func TestExitDuringASpawnKeepsItsMounts(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "a", "name": "s", "command": "sh"})
	inst, err := e.s.activeVM()
	require.NoError(t, err)
	done := inst.mounts.use("s") // as a second spawn does until its process is registered
	g.agent.exit("a", 0)
	e.next(protocol.EventExit)
	assertNoMoreUnshares(t, g, 0)
	done() // that spawn failed: now the session is idle
	home := filepath.Join(e.s.sessionsDir, "s")
	assert.Equal(t, []protocol.MountSource{bind(home)}, waitUnshares(t, g, 1))
}

// readFile after the last exit mounts the path's mounts again for the
// read, and withdraws them after.
func TestReadFileAfterLastExit(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	out := t.TempDir()
	e.spawn(map[string]any{"id": "a", "name": "s", "command": "sh",
		"additionalMounts": map[string]any{"out": map[string]string{"path": rel(out), "mode": "rw"}}})
	g.agent.exit("a", 0)
	e.next(protocol.EventExit)
	waitUnshares(t, g, 2)
	g.agent.mu.Lock()
	g.agent.files["/sessions/s/mnt/out/result.txt"] = []byte("result")
	g.agent.mu.Unlock()

	shared, _ := g.shareState()
	var r protocol.ClientReadFileResult
	e.mustCall("readFile", map[string]any{"processName": "s", "filePath": "/sessions/s/mnt/out/result.txt"}, &r)
	again, _ := g.shareState()
	home := filepath.Join(e.s.sessionsDir, "s")
	assert.Equal(t, []string{home, out}, again[len(shared):], "home first, then the mount holding the file")
	got := waitUnshares(t, g, 4)
	assert.ElementsMatch(t, []protocol.MountSource{bind(home), bind(out)}, got[2:], "withdrawn again after the read")
}

// Deleting a session withdraws whatever of it is still shared.
func TestDeleteSessionDirsWithdrawsItsMounts(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "a", "name": "s", "command": "sh"})
	g.agent.exit("a", 0)
	e.next(protocol.EventExit)
	waitUnshares(t, g, 1)
	// mountPath for the exited process shares the home and a mount again,
	// with no process to end them.
	extra := t.TempDir()
	e.mustCall("mountPath", map[string]any{"processId": "a", "subpath": rel(extra), "mountName": "extra", "mode": "ro"}, nil)
	var r protocol.DeleteResult
	e.mustCall("deleteSessionDirs", map[string]any{"names": []string{"s"}}, &r)
	require.Equal(t, []string{"s"}, r.Deleted)
	home := filepath.Join(e.s.sessionsDir, "s")
	got := waitUnshares(t, g, 3)
	assert.ElementsMatch(t, []protocol.MountSource{bind(home), bind(extra)}, got[1:])
	assertNoMoreUnshares(t, g, 3)

	// Nothing of it is mounted again by a read.
	shared, _ := g.shareState()
	_ = e.call("readFile", map[string]any{"processName": "s", "filePath": "/sessions/s/x"}, nil)
	again, _ := g.shareState()
	assert.True(t, slices.Equal(shared, again), "no share after the deletion: %v", again[len(shared):])
}
