package helper

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Issue #18: a helper restart lost everything the client had set. These
// tests set it on one Helper, then start another on the same data
// directory, as the client's respawn of a killed helper does.

// installFakeSDK makes root/<version>/claude and returns installSdk's params.
func installFakeSDK(t *testing.T, root, version string) map[string]any {
	t.Helper()
	writeFile(t, filepath.Join(root, version, "claude"), 10)
	return map[string]any{"sdkSubpath": strings.TrimPrefix(root, "/"), "version": version}
}

func TestStateSurvivesARestart(t *testing.T) {
	data := t.TempDir()
	e := newTestEnvWith(t, func(o *Options) { o.DataDir = data })
	sdkRoot := t.TempDir()
	e.mustCall("configure", map[string]any{"userDataName": testProfile, "userDataRoot": testProfileRoot, "memoryMB": 2048, "cpuCount": 3}, nil)
	e.mustCall("createVM", map[string]any{"bundlePath": "/b", "diskSizeGB": 2}, nil)
	e.mustCall("installSdk", installFakeSDK(t, sdkRoot, "1.0.0"), nil)
	e.mustCall("addApprovedOauthToken", map[string]any{"token": "approved"}, nil)
	e.start()
	e.spawn(map[string]any{"id": "before", "name": "s", "command": "sh"})

	// The helper dies (its guest with it); the client starts another.
	backend := &fakeBackend{t: t}
	h := newHelper(t, data, backend)
	oneShot := context.Background()
	var running protocol.IsRunningResult
	require.NoError(t, callOn(t, h, oneShot, "isRunning", nil, &running))
	assert.False(t, running.Running, "no guest after a restart")
	var connected protocol.IsGuestConnectedResult
	require.NoError(t, callOn(t, h, oneShot, "isGuestConnected", nil, &connected))
	assert.False(t, connected.Connected)
	var pr protocol.IsProcessRunningResult
	require.NoError(t, callOn(t, h, oneShot, "isProcessRunning", map[string]any{"id": "before"}, &pr))
	assert.Equal(t, protocol.IsProcessRunningResult{}, pr, "nothing stale: the old process is unknown")

	// The client's calls again; no installSdk, no token: both were kept.
	ctx := configured(t, h, testProfile, testProfileRoot)
	startOn(t, h, ctx)
	g := backend.last()
	assert.Equal(t, 2048, g.cfg.MemoryMiB)
	assert.Equal(t, 3, g.cfg.CPUCount)
	m, ok := g.agent.mountAt(GuestSDKPath)
	require.True(t, ok, "the SDK is mounted at boot")
	assert.Equal(t, filepath.Join(sdkRoot, "1.0.0"), m.Source.Path)
	var sr protocol.SpawnResult
	require.NoError(t, callOn(t, h, ctx, "spawn", map[string]any{"id": "after", "name": "s", "command": GuestSDKPath}, &sr))
	sp, ok := g.agent.spawned("after")
	require.True(t, ok)
	assert.Contains(t, sp.Env, "CLAUDE_CODE_OAUTH_TOKEN=approved")
	var disk protocol.DiskInfoResult
	require.NoError(t, callOn(t, h, ctx, "getSessionsDiskInfo", map[string]any{"lowWaterBytes": 0}, &disk))
	assert.Equal(t, int64(2<<30), disk.TotalBytes, "the quota")

	assertStateFiles(t, data)
}

// assertStateFiles checks that every state file is 0600 and that no
// temporary file was left behind.
func assertStateFiles(t *testing.T, data string) {
	t.Helper()
	found := 0
	require.NoError(t, filepath.WalkDir(data, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() && filepath.Base(p) == "sessions" {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".json") && !strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		found++
		assert.False(t, strings.HasPrefix(d.Name(), "."), "temporary file left: %s", p)
		fi, err := d.Info()
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), p)
		return nil
	}))
	assert.GreaterOrEqual(t, found, 2, "helper.json and a profile.json")
}

// An SDK removed from the host while the helper was down is forgotten: the
// guest boots without it.
func TestRestartWithTheSDKGone(t *testing.T) {
	data, sdkRoot := t.TempDir(), t.TempDir()
	e := newTestEnvWith(t, func(o *Options) { o.DataDir = data })
	e.mustCall("installSdk", installFakeSDK(t, sdkRoot, "1.0.0"), nil)
	require.NoError(t, os.RemoveAll(filepath.Join(sdkRoot, "1.0.0")))

	backend := &fakeBackend{t: t}
	h := newHelper(t, data, backend)
	ctx := configured(t, h, testProfile, testProfileRoot)
	startOn(t, h, ctx)
	_, ok := backend.last().agent.mountAt(GuestSDKPath)
	assert.False(t, ok)
}

// An SDK removed from the host while the helper runs, before a boot: the
// guest boots without it rather than fail.
func TestBootWithTheSDKGone(t *testing.T) {
	e := newTestEnv(t)
	sdkRoot := t.TempDir()
	e.mustCall("installSdk", installFakeSDK(t, sdkRoot, "1.0.0"), nil)
	require.NoError(t, os.RemoveAll(filepath.Join(sdkRoot, "1.0.0")))
	g := e.start()
	_, ok := g.agent.mountAt(GuestSDKPath)
	assert.False(t, ok)
	e.s.mu.Lock()
	assert.Nil(t, e.s.sdk, "forgotten")
	e.s.mu.Unlock()
}

// Stateless (the run subcommand) reads and writes no state and takes no
// profile's sessions.
func TestStatelessKeepsNothing(t *testing.T) {
	data := t.TempDir()
	writeFile(t, filepath.Join(data, "sessions", "old", "f"), 10)
	h := newHelper(t, data, &fakeBackend{t: t}, func(o *Options) { o.Stateless = true })
	ctx := configured(t, h, "cowork-vmm-run", "")
	require.NoError(t, callOn(t, h, ctx, "configure", map[string]any{"userDataName": "cowork-vmm-run", "memoryMB": 1024}, nil))
	require.NoError(t, callOn(t, h, ctx, "addApprovedOauthToken", map[string]any{"token": "t"}, nil))
	assert.Empty(t, sessionNamesOf(t, h, ctx))
	var files []string
	require.NoError(t, filepath.WalkDir(data, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".json") {
			files = append(files, p)
		}
		return err
	}))
	assert.Empty(t, files)
}

// A state file written before is replaced whole (temporary file + rename).
func TestWriteJSONReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	require.NoError(t, os.WriteFile(p, []byte(`{"old":true}`), 0o644))
	require.NoError(t, writeJSON(p, map[string]int{"new": 1}))
	var got map[string]int
	require.NoError(t, readJSON(p, &got))
	assert.Equal(t, map[string]int{"new": 1}, got)
	fi, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the new file's mode, not the old one's")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")
}
