package agent

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
)

// A suspend ends every process (their exit events before the reply),
// drops the caches and ends the channel; the next Run on the same kept
// state, in a resumed guest, answers resume with the first setup's result
// and refuses a second setup.
func TestSuspendThenResumeOnTheKeptRoot(t *testing.T) {
	var drops atomic.Int32
	keep := &keptState{dropCaches: func() error { drops.Add(1); return nil }}
	c := startAgent(t, Options{keep: keep})
	require.ErrorContains(t, c.Call(protocol.AgentMethodResume, protocol.ResumeParams{}, nil), "not resumed")
	keep.setUp(protocol.SetupResult{RootDisk: "mounted", SessionTmp: true})
	c.spawn("long", "sleep", "60")
	require.NoError(t, c.Call(protocol.AgentMethodSuspend, protocol.SuspendParams{GraceMillis: 300}, nil))
	var long *agenttest.Output
	c.Locked(func(procs map[string]*agenttest.Output) { long = procs["long"] })
	require.NotNil(t, long)
	require.NotNil(t, long.Exit, "the exit event comes before the reply")
	require.Equal(t, "SIGTERM", long.Exit.Signal)
	require.EqualValues(t, 1, drops.Load())
	c.WaitClosed()

	keep.resume()
	assert.Nil(t, keep.bootIDBytes(), "no boot id of its own before the reseed")
	c = startAgent(t, Options{keep: keep})
	var got protocol.SetupResult
	// A seed of the wrong length is not used: the agent reads virtio-rng
	// instead (absent here: logged).
	require.NoError(t, c.Call(protocol.AgentMethodResume, protocol.ResumeParams{ClockUnixNano: time.Now().UnixNano(), Seed: []byte("short")}, &got))
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$`, string(keep.bootIDBytes()), "a fresh boot id")
	require.Equal(t, "mounted", got.RootDisk)
	require.True(t, got.SessionTmp)
	require.NotEmpty(t, got.Steps)
	require.Equal(t, "hello", got.Steps[0].Name)
}

// An agent that keeps nothing (the process backend's) refuses suspend and
// stays connected.
func TestSuspendRefusedWithoutKeptState(t *testing.T) {
	c := startAgent(t, Options{})
	require.ErrorContains(t, c.Call(protocol.AgentMethodSuspend, protocol.SuspendParams{}, nil), "cannot be suspended")
	require.NoError(t, c.Call(protocol.AgentMethodPing, nil, nil))
}

func TestUnderAnyOf(t *testing.T) {
	dirs := []string{"/sessions/s", "/mnt/"}
	require.True(t, underAnyOf("/sessions/s/mnt/extra", dirs))
	require.True(t, underAnyOf("/mnt/a", dirs))
	require.False(t, underAnyOf("/sessions/s", dirs), "a directory is not beneath itself")
	require.False(t, underAnyOf("/sessions/sx/mnt", dirs), "a sibling with a longer name is not beneath")
	require.False(t, underAnyOf("/sessions/s/mnt", nil))
}
