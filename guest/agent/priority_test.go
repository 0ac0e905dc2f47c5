package agent

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// niceOf is the nice value (field 19) of a /proc/<pid>/stat line.
func niceOf(t *testing.T, stat string) int {
	t.Helper()
	// The command name (field 2) may hold spaces; fields after it do not.
	end := strings.LastIndexByte(stat, ')')
	require.Positive(t, end, "stat line %q", stat)
	fields := strings.Fields(stat[end+1:])
	require.Greater(t, len(fields), 16, "stat line %q", stat)
	nice, err := strconv.Atoi(fields[16]) // field 19 is the 17th after the name
	require.NoError(t, err)
	return nice
}

// A spawn runs at a lower priority than the agent: its nice value, as it
// reads it itself, is higher. The agent's is that of a thread of ours
// (nice is per thread; /proc/self/stat shows the main thread's, which a
// spawn's fork may have taken and left wedged at the spawn's nice value
// when it ran on it).
func TestSpawnsRunBelowTheAgentsPriority(t *testing.T) {
	runtime.LockOSThread()
	own, err := os.ReadFile("/proc/thread-self/stat")
	runtime.UnlockOSThread()
	require.NoError(t, err)
	agentNice := niceOf(t, string(own))
	if agentNice >= 19 {
		t.Skipf("the agent already runs at the lowest priority (nice %d)", agentNice)
	}
	c := startAgent(t, Options{})
	c.spawn("stat", "cat", "/proc/self/stat")
	p := c.WaitExit("stat")
	spawnNice := niceOf(t, p.Stdout.String())
	require.Greater(t, spawnNice, agentNice, "the spawn's nice value against the agent's")
	require.Equal(t, min(agentNice+spawnNiceIncrement, 19), spawnNice)
	t.Logf("agent nice %d, spawn nice %d", agentNice, spawnNice)
}
