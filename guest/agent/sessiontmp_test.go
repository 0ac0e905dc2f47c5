package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

func TestSessionTmpWithoutARootDiskIsATmpfsOfItsOwn(t *testing.T) {
	m := newMounter(slog.New(slog.DiscardHandler), true)
	dir, err := m.sessionTmpFor("s")
	require.NoError(t, err)
	assert.Empty(t, dir)
	assert.False(t, m.hasSessionTmp())
	res, err := m.pruneTmp(protocol.PruneTmpParams{Sessions: []string{"s"}})
	require.NoError(t, err)
	assert.Zero(t, res.FreedBytes)
}

func TestSessionTmpOnTheDisk(t *testing.T) {
	disk := t.TempDir()
	m := newMounter(slog.New(slog.DiscardHandler), true)
	require.NoError(t, m.startSessionTmp(disk))
	require.True(t, m.hasSessionTmp())

	dir, err := m.sessionTmpFor("s1")
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(disk, "tmp", "s1"), dir)
	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.ModeDir|os.ModeSticky|0o777, st.Mode(), "world-writable and sticky, like /tmp")
	again, err := m.sessionTmpFor("s1")
	require.NoError(t, err)
	assert.Equal(t, dir, again, "one per session, shared by its spawns")

	// A session's /tmp: an old build tree, a fresh file, and a symlink
	// planted towards the agent's own files.
	precious := filepath.Join(t.TempDir(), "agent-file")
	require.NoError(t, os.WriteFile(precious, []byte("agent"), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "build", "obj"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "build", "obj", "a.o"), make([]byte, 4096), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fresh"), []byte("new"), 0o644))
	require.NoError(t, os.Symlink(filepath.Dir(precious), filepath.Join(dir, "escape")))
	old := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(filepath.Join(dir, "build"), old, old))

	res, err := m.pruneTmp(protocol.PruneTmpParams{Sessions: []string{"s1", "never-ran", "../x"}, OlderThanSeconds: 3600})
	require.NoError(t, err)
	assert.Equal(t, []string{"s1"}, res.Pruned)
	assert.GreaterOrEqual(t, res.FreedBytes, int64(4096))
	assert.Contains(t, res.Errors, "../x", "a name that is not one session is refused")
	assert.NotContains(t, res.Errors, "never-ran", "a session without a /tmp has nothing to prune")
	assert.NoDirExists(t, filepath.Join(dir, "build"))
	assert.FileExists(t, filepath.Join(dir, "fresh"))

	res, err = m.pruneTmp(protocol.PruneTmpParams{Sessions: []string{"s1"}})
	require.NoError(t, err)
	assert.Empty(t, res.Errors)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "older than 0 s: everything")
	assert.FileExists(t, precious, "the planted symlink went, not what it pointed to")

	_, err = m.pruneTmp(protocol.PruneTmpParams{Sessions: []string{"s1"}, Remove: true})
	require.NoError(t, err)
	assert.NoDirExists(t, dir, "a deleted session's /tmp goes whole")
}

func TestSessionTmpStartsEmptyAtEachStart(t *testing.T) {
	disk := t.TempDir()
	m := newMounter(slog.New(slog.DiscardHandler), true)
	require.NoError(t, m.startSessionTmp(disk))
	dir, err := m.sessionTmpFor("s")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "left"), []byte("x"), 0o644))

	next := newMounter(slog.New(slog.DiscardHandler), true) // the next start
	require.NoError(t, next.startSessionTmp(disk))
	dir, err = next.sessionTmpFor("s")
	require.NoError(t, err)
	assert.NoFileExists(t, filepath.Join(dir, "left"))
	assert.Eventually(t, func() bool {
		entries, err := os.ReadDir(disk)
		if err != nil {
			return false
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), staleTmpPrefix) {
				return false
			}
		}
		return len(entries) == 1
	}, 10*time.Second, 10*time.Millisecond, "the previous start's /tmp is removed in the background")
}
