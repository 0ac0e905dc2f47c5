package agent

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunTool: a tool the agent runs is waited for through the agent's
// reaper (which reaps every child); a failure carries its status and
// output, and one that overstays its timeout is killed.
func TestRunTool(t *testing.T) {
	a := &agent{log: slog.New(slog.DiscardHandler)}
	a.procs = newProcessTable(a)
	stop := a.procs.startReaper()
	defer stop()

	require.NoError(t, a.procs.runTool(10*time.Second, "/bin/sh", "-c", "exit 0"))
	err := a.procs.runTool(10*time.Second, "/bin/sh", "-c", "echo the reason >&2; exit 3")
	assert.ErrorContains(t, err, "exited with status 3")
	assert.ErrorContains(t, err, "the reason")
	began := time.Now()
	err = a.procs.runTool(200*time.Millisecond, "/bin/sh", "-c", "sleep 30")
	assert.ErrorContains(t, err, "did not finish")
	assert.Less(t, time.Since(began), 10*time.Second, "killed at the timeout")
	assert.ErrorContains(t, a.procs.runTool(time.Second, "/no/such/tool"), "starting /no/such/tool")
	a.procs.mu.Lock()
	assert.Empty(t, a.procs.byPID, "every tool was reaped")
	a.procs.mu.Unlock()
}
