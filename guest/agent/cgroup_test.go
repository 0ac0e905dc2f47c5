package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseOOMKills(t *testing.T) {
	for _, c := range []struct {
		events string
		want   int
		ok     bool
	}{
		{"low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n", 2, true},
		{"oom_kill 0\n", 0, true},
		{"oom 1\n", 0, false},
		{"oom_kill x\n", 0, false},
		{"oom_kill 99999999999\n", 0, false}, // past int32: not a count we pass on
		{"", 0, false},
	} {
		n, ok := parseOOMKills([]byte(c.events))
		assert.Equal(t, c.ok, ok, "%q", c.events)
		assert.Equal(t, c.want, n, "%q", c.events)
	}
}

func TestSpawnMemoryMax(t *testing.T) {
	const mib = 1 << 20
	assert.Equal(t, uint64(896*mib), spawnMemoryMax(1024*mib), "an eighth kept back")
	assert.Equal(t, uint64(256*mib-64*mib), spawnMemoryMax(256*mib), "at least 64 MiB kept back")
	assert.Equal(t, uint64(16384*mib-512*mib), spawnMemoryMax(16384*mib), "at most 512 MiB kept back")
	assert.Zero(t, spawnMemoryMax(100*mib), "too small to spare a reserve: no limit")
	assert.Zero(t, spawnMemoryMax(0))
	assert.Equal(t, uint64(1014452*1024), parseMemTotal([]byte("MemTotal:        1014452 kB\nMemFree:  1 kB\n")))
	assert.Zero(t, parseMemTotal([]byte("MemFree:  1 kB\n")))
}

// fakeCgroupRoot is a directory laid out like a cgroup2 mount's root.
func fakeCgroupRoot(t *testing.T, controllers string) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte(controllers), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), nil, 0o644))
	return root
}

// fakeCgroupParent makes the spawns' parent below a fake root with the
// files the kernel would give it.
func fakeCgroupParent(t *testing.T, root string) string {
	t.Helper()
	parent := filepath.Join(root, spawnCgroupParent)
	require.NoError(t, os.Mkdir(parent, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(parent, "memory.max"), nil, 0o644))
	return parent
}

// TestCgroupLayout: the spawns' parent enables the memory controller and
// has the memory limit; each spawn gets the next cgroup below it, whose
// oom_kill count is read at the exit; a cgroup that still holds processes
// at its release is removed at a later spawn.
func TestCgroupLayout(t *testing.T) {
	root := fakeCgroupRoot(t, "cpuset cpu io memory pids\n")
	parent := fakeCgroupParent(t, root)
	got, err := setupCgroupParent(root, 1<<30)
	require.NoError(t, err)
	assert.Equal(t, parent, got)
	for file, want := range map[string]string{
		filepath.Join(root, "cgroup.subtree_control"):   "+memory",
		filepath.Join(parent, "cgroup.subtree_control"): "+memory",
		filepath.Join(parent, "memory.max"):             "939524096",
	} {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		assert.Equal(t, want, string(b), file)
	}

	c := &cgroups{log: slog.New(slog.DiscardHandler), parent: parent}
	g, err := c.create()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(parent, "1"), g.dir)
	_, ok := g.oomKills()
	assert.False(t, ok, "no memory.events: nothing to report")
	require.NoError(t, os.WriteFile(filepath.Join(g.dir, "memory.events"), []byte("oom 1\noom_kill 1\n"), 0o644))
	n, ok := g.oomKills()
	assert.True(t, ok)
	assert.Equal(t, 1, n)
	c.release(g) // still holds a file, as a cgroup holds processes
	assert.DirExists(t, g.dir)
	require.NoError(t, os.Remove(filepath.Join(g.dir, "memory.events")))
	g2, err := c.create()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(parent, "2"), g2.dir)
	assert.NoDirExists(t, g.dir, "emptied since: removed at the next spawn")
	c.release(g2)
	assert.NoDirExists(t, g2.dir)
}

// TestNoCgroups: without cgroup v2 and its memory controller, spawns get
// no cgroup, and none is asked for without a root.
func TestNoCgroups(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, root := range []string{"", t.TempDir(), fakeCgroupRoot(t, "cpu pids\n")} {
		c := newCgroups(log, root)
		g, err := c.create()
		require.NoError(t, err)
		assert.Nil(t, g, "root %q", root)
		c.release(g)
	}
	var none *cgroups
	g, err := none.create()
	require.NoError(t, err)
	assert.Nil(t, g)
}

// TestCgroupsPreparedInTheBackground: newCgroups returns before the parent
// is made, and the first spawn's cgroup waits for it and lands below it.
func TestCgroupsPreparedInTheBackground(t *testing.T) {
	root := fakeCgroupRoot(t, "memory\n")
	parent := fakeCgroupParent(t, root)
	c := newCgroups(slog.New(slog.DiscardHandler), root)
	g, err := c.create()
	require.NoError(t, err)
	require.NotNil(t, g, "the first spawn waited for the parent")
	assert.Equal(t, filepath.Join(parent, "1"), g.dir)
	c.release(g)
}
