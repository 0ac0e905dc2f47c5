package helper

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// A guest that can be suspended is suspended at stopVM, not shut down:
// its process's exit event still goes out, the guest is saved; the next
// start of a resumed guest sends resume, not setup.
func TestStopVMSuspendsAndStartVMResumes(t *testing.T) {
	e := newTestEnv(t)
	e.backend.suspender = true
	g := e.start()
	e.spawn(map[string]any{"id": "p1", "name": "s1", "command": "/bin/sleep"})
	e.mustCall("stopVM", nil, nil)
	ev := e.next(protocol.EventExit)
	assert.Equal(t, "p1", ev.ID)
	assert.Equal(t, "SIGTERM", ev.Signal)
	suspends, _, shutdowns := g.agent.counts()
	assert.Equal(t, 1, suspends)
	assert.Zero(t, shutdowns, "a suspended guest is not shut down")
	prepared, saved := g.suspendCalls()
	assert.Equal(t, 1, prepared)
	assert.Equal(t, 1, saved)

	e.backend.resumed = true
	g = e.start()
	_, resumes, _ := g.agent.counts()
	assert.Equal(t, 1, resumes)
	g.agent.mu.Lock()
	assert.Nil(t, g.agent.setup, "a resumed guest is not set up again")
	g.agent.mu.Unlock()
	e.spawn(map[string]any{"id": "p2", "name": "s1", "command": "/bin/true"})
	_, ok := g.agent.spawned("p2")
	assert.True(t, ok)
}

// An agent that refuses to suspend is shut down as ever, and the guest is
// not saved.
func TestStopVMShutsDownWhenTheAgentRefusesSuspend(t *testing.T) {
	e := newTestEnv(t)
	e.backend.suspender = true
	g := e.start()
	g.agent.mu.Lock()
	g.agent.refuseSuspend = true
	g.agent.mu.Unlock()
	e.mustCall("stopVM", nil, nil)
	suspends, _, shutdowns := g.agent.counts()
	assert.Zero(t, suspends)
	assert.Equal(t, 1, shutdowns)
	_, saved := g.suspendCalls()
	assert.Zero(t, saved)
	require.True(t, g.stopped)
}
