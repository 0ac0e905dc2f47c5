package process

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
)

// saturationPingTimeout is the helper's default ping timeout (2 s interval,
// 5 intervals).
const saturationPingTimeout = 10 * time.Second

// With every CPU kept busy by spawned loops (two per CPU), the agent still
// answers pings well within the helper's timeout, and the loops run at a
// lower priority (a higher nice value) than the agent.
func TestPingsAnswerWhileSpawnsSaturateEveryCPU(t *testing.T) {
	_, c := startSandbox(t)
	loops := 2 * runtime.NumCPU()
	ids := make([]string, loops)
	for i := range ids {
		ids[i] = fmt.Sprintf("busy%d", i)
		// The loop reports its own nice value, then spins.
		require.NoError(t, c.call(protocol.AgentMethodSpawn, protocol.SpawnParams{
			ID: ids[i], Command: "sh", Args: []string{"-c", "cut -d' ' -f19 /proc/$$/stat; while :; do :; done"},
			Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"},
		}))
	}
	defer func() {
		for _, id := range ids {
			_ = c.call(protocol.AgentMethodKill, protocol.KillParams{ID: id, Signal: "SIGKILL"})
			c.WaitExit(id)
		}
	}()
	waitNice := time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for {
			out := ""
			c.Locked(func(procs map[string]*agenttest.Output) {
				if r := procs[id]; r != nil {
					out = r.Stdout.String()
				}
			})
			if strings.HasSuffix(out, "\n") {
				nice, err := strconv.Atoi(strings.TrimSpace(out))
				require.NoError(t, err, "the loop's nice value %q", out)
				require.Positive(t, nice, "the loop runs at the agent's priority")
				break
			}
			require.True(t, time.Now().Before(waitNice), "loop %s never reported its nice value", id)
			time.Sleep(5 * time.Millisecond)
		}
	}
	var slowest time.Duration
	for range 20 {
		start := time.Now()
		require.NoError(t, c.call(protocol.AgentMethodPing, nil))
		slowest = max(slowest, time.Since(start))
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d busy loops on %d CPUs: slowest of 20 pings %v", loops, runtime.NumCPU(), slowest)
	require.Less(t, slowest, saturationPingTimeout/2)
}
