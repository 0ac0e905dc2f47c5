package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// TestBusyGuestStaysConnected: spawns that keep every guest CPU busy do
// not make the helper take the guest for dead (process backend).
func TestBusyGuestStaysConnected(t *testing.T) { busyGuestStaysConnected(t, e2eBackend(t)) }

// TestKVMBusyGuestStaysConnected is TestBusyGuestStaysConnected in a VM
// (TestNestedKVMRealWorkload runs it in the harness).
func TestKVMBusyGuestStaysConnected(t *testing.T) {
	busyGuestStaysConnected(t, kvmBackend(t, "TestNestedKVMRealWorkload"))
	recordBoot(t)
}

// busyWindow is how long the loops spin: past two of the helper's ping
// timeouts (10 s), so a ping starved by them would have failed twice.
const busyWindow = 25 * time.Second

// busyGuestStaysConnected spins two loops per guest CPU (a 1-CPU guest)
// for busyWindow and checks that the loops run below the agent's priority,
// that no ping fails meanwhile, that isGuestConnected stays true and a
// spawn still answers.
func busyGuestStaysConnected(t *testing.T, backend string) {
	h := startHelper(t, backend)
	c := profilePipe(t, h.socket, "busy")
	ev := subscribeProfile(t, h.socket, "busy")
	bootProfile(t, c, "busy")
	const loops = 2
	for i := range loops {
		id := fmt.Sprintf("busy%d", i)
		c.call("spawn", map[string]any{"id": id, "name": "busy", "command": "/bin/sh",
			"args": sh("cut -d' ' -f19 /proc/$$/stat; while :; do :; done")}, nil)
		ev.wait(id+"'s nice value", func(protocol.Event) bool { return strings.HasSuffix(ev.outputLocked(protocol.EventStdout, id), "\n") })
		nice, err := strconv.Atoi(strings.TrimSpace(ev.output(protocol.EventStdout, id)))
		require.NoError(t, err)
		assert.Positive(t, nice, "a spawn runs below the agent's priority")
	}
	var slowest time.Duration
	for start, n := time.Now(), 0; time.Since(start) < busyWindow; n++ {
		var r struct {
			Connected bool `json:"connected"`
		}
		c.call("isGuestConnected", nil, &r)
		require.True(t, r.Connected, "the busy guest is still connected after %v", time.Since(start))
		id := fmt.Sprintf("probe%d", n)
		spawned := time.Now()
		c.call("spawn", map[string]any{"id": id, "name": "busy", "command": "/bin/echo", "args": []string{"alive"}}, nil)
		exit := ev.exit(id)
		slowest = max(slowest, time.Since(spawned))
		require.NotNil(t, exit.ExitCode)
		require.Equal(t, 0, *exit.ExitCode)
		time.Sleep(time.Second)
	}
	assert.NotContains(t, h.stderr.String(), "did not answer a ping", "no ping failed while the guest was busy")
	t.Logf("%d busy loops on a 1-CPU guest (%s backend) for %v: slowest spawn of echo %v", loops, backend, busyWindow, slowest.Round(time.Millisecond))
	for i := range loops {
		c.call("kill", map[string]any{"id": fmt.Sprintf("busy%d", i), "signal": "SIGKILL"}, nil)
	}
	c.call("stopVM", nil, nil)
}
