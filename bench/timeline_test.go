package bench

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

func TestTimelineFromEventStream(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	step := func(name, status string) protocol.Event {
		return protocol.Event{Type: protocol.EventStartupStep, Step: name, Status: status}
	}
	tl := NewTimeline()
	tl.Mark(MarkExec, at(0))
	tl.Mark(MarkSocket, at(20))
	tl.Mark(MarkStartSent, at(30))
	stream := []struct {
		ev protocol.Event
		at int
	}{
		{step("launch_guest", protocol.StepStarted), 31},
		{step(stepVMCreate, protocol.StepStarted), 32},
		{step(stepVMCreate, protocol.StepCompleted), 50},
		{step(stepKernelLoad, protocol.StepStarted), 50},
		{step(stepKernelLoad, "failed"), 55}, // not a completion
		{step(stepKernelLoad, protocol.StepCompleted), 60},
		{step("launch_guest", protocol.StepCompleted), 61},
		{step(stepGuestBoot, protocol.StepStarted), 61},
		{step(stepGuestBoot, protocol.StepCompleted), 160},
		{step(stepGuestBoot, protocol.StepCompleted), 999}, // a repeat does not move the mark
		{step(stepAgentDial, protocol.StepStarted), 160},
		{step(stepAgentDial, protocol.StepCompleted), 172},
		{step(helper.StepAgentHello, protocol.StepCompleted), 173},
		{step(helper.StepGuestSetup, protocol.StepCompleted), 179},
		{protocol.Event{Type: protocol.EventExit, ID: "other"}, 170},
		{protocol.Event{Type: protocol.EventExit, ID: trueID}, 205},
		{protocol.Event{Type: protocol.EventStdout, ID: echoID, Data: ""}, 208},
		{protocol.Event{Type: protocol.EventStdout, ID: echoID, Data: "cowork-bench\n"}, 210},
		{protocol.Event{Type: protocol.EventStdout, ID: echoID, Data: "more"}, 220},
	}
	for _, s := range stream {
		tl.OnEvent(s.ev, at(s.at), trueID, echoID)
	}
	tl.Mark(MarkStartReply, at(62))
	tl.Mark(MarkConnected, at(180))
	tl.Mark(MarkSpawnSent, at(200))
	tl.Mark(MarkEchoSent, at(206))
	tl.Mark(MarkStopSent, at(230))
	tl.Mark(MarkGone, at(240))

	ms := time.Millisecond
	assert.Equal(t, map[string]time.Duration{
		"helper_start":       20 * ms,
		"vm_create":          20 * ms,
		"vcpu_start":         10 * ms,
		"kernel_boot":        100 * ms,
		"start_to_init":      130 * ms,
		"start_reply":        32 * ms,
		"agent_dial":         12 * ms,
		"agent_setup":        8 * ms,
		"agent_hello":        1 * ms,
		"guest_setup":        6 * ms,
		"connected_poll":     1 * ms,
		"agent_connect":      20 * ms,
		"start_to_connected": 150 * ms,
		"spawn_exit":         5 * ms,
		"echo_first_byte":    4 * ms,
		"stop":               10 * ms,
	}, tl.Durations())
}

func TestTimelineOfTheProcessBackendHasNoVMPhases(t *testing.T) {
	t0 := time.Unix(0, 0)
	tl := NewTimeline()
	tl.Mark(MarkStartSent, t0)
	tl.OnEvent(protocol.Event{Type: protocol.EventStartupStep, Step: "sandbox", Status: protocol.StepCompleted}, t0.Add(time.Millisecond), "", "")
	tl.Mark(MarkStartReply, t0.Add(2*time.Millisecond))
	tl.Mark(MarkConnected, t0.Add(9*time.Millisecond))
	d := tl.Durations()
	assert.Equal(t, map[string]time.Duration{"start_reply": 2 * time.Millisecond, "start_to_connected": 9 * time.Millisecond}, d)
}

func TestTimelineDropsReversedSpans(t *testing.T) {
	t0 := time.Unix(0, 0)
	tl := NewTimeline()
	tl.Mark(MarkStopSent, t0.Add(time.Second))
	tl.Mark(MarkGone, t0)
	assert.Empty(t, tl.Durations())
}

func TestPhasesAreWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Phases {
		require.False(t, seen[p.ID], "duplicate phase %s", p.ID)
		seen[p.ID] = true
		assert.NotEmpty(t, p.Label)
		assert.NotEqual(t, p.From, p.To)
	}
	assert.True(t, seen["start_to_init"], "the phase qemu is compared on")
}

func TestSetupBreakdownFromTheHelperLog(t *testing.T) {
	path := t.TempDir() + "/helper.log"
	log := `time=x level=INFO msg="guest agent dialed"
time=x level=INFO msg="guest root set up" share=120µs setup=80ms agent.mount:/usr=30ms
time=x level=INFO msg="guest agent connected"
`
	require.NoError(t, os.WriteFile(path, []byte(log), 0o644))
	assert.Equal(t, "share=120µs setup=80ms agent.mount:/usr=30ms", setupBreakdown(path))
	assert.Empty(t, setupBreakdown(t.TempDir()+"/missing.log"))
}

// TestParseSetupSteps: the timed attributes of a set-up record, as the
// helper logs them, in order; the others are not steps.
func TestParseSetupSteps(t *testing.T) {
	attrs := `profile=cowork-vmm-bench share=5.902ms setup=1.35732s agent.hello=123.789ms agent.mount:/lib64=41µs ` +
		`agent.root_disk.overlay:/usr=117.428ms rootDisk="formatted and mounted" sessionTmpOnDisk=true`
	assert.Equal(t, []SetupStep{
		{"share", 5902 * time.Microsecond}, {"setup", 1357320 * time.Microsecond},
		{"agent.hello", 123789 * time.Microsecond}, {"agent.mount:/lib64", 41 * time.Microsecond},
		{"agent.root_disk.overlay:/usr", 117428 * time.Microsecond},
	}, parseSetupSteps(attrs))
	assert.Empty(t, parseSetupSteps(""))
}
