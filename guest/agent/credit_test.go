package agent

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
)

// spawnWindow spawns with an output window (flow control).
func (c *testClient) spawnWindow(id string, window int64, args ...string) error {
	c.t.Helper()
	return c.Call(protocol.AgentMethodSpawn, protocol.SpawnParams{
		ID: id, Command: args[0], Args: args[1:], Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}, OutputWindow: window,
	}, nil)
}

// outputBytes is what process id has sent so far.
func (c *testClient) outputBytes(id string) (n int, exited bool) {
	c.Locked(func(procs map[string]*agenttest.Output) {
		if p := procs[id]; p != nil {
			n, exited = p.Stdout.Len(), p.Exit != nil
		}
	})
	return n, exited
}

// TestOutputWaitsForCredit: a process spawned with a window sends no more
// than the window (and one event) until credit comes, and blocks on its
// pipe meanwhile; credit lets the rest through, then the exit.
func TestOutputWaitsForCredit(t *testing.T) {
	c := startAgent(t, Options{})
	const size = 1 << 20
	const window = protocol.MinOutputWindow
	require.NoError(t, c.spawnWindow("p", window, "sh", "-c", fmt.Sprintf("yes 'some output' | head -c %d; echo done >&2", size)))
	// The first output, however slow the host is to start the pipeline
	// (an emulated CPU under load took seconds), then time to fill the window.
	c.WaitFor("p", "output", func(p *agenttest.Output) bool { return p.Stdout.Len() > 0 })
	time.Sleep(300 * time.Millisecond)
	held, exited := c.outputBytes("p")
	assert.False(t, exited, "the process waits for credit")
	assert.LessOrEqual(t, held, window+protocol.MaxOutputChunkBytes, "no more than the window and one event")
	assert.Positive(t, held)
	time.Sleep(200 * time.Millisecond)
	again, _ := c.outputBytes("p")
	assert.Equal(t, held, again, "nothing more without credit")

	assert.ErrorContains(t, c.Call(protocol.AgentMethodCredit, protocol.CreditParams{ID: "p", Bytes: 0}, nil), "want 1 to")
	assert.ErrorContains(t, c.Call(protocol.AgentMethodCredit, protocol.CreditParams{ID: "p", Bytes: protocol.MaxOutputWindow + 1}, nil), "want 1 to")
	assert.ErrorContains(t, c.Call(protocol.AgentMethodCredit, protocol.CreditParams{ID: "nobody", Bytes: 1}, nil), "no running process")
	assert.ErrorContains(t, c.spawnWindow("q", protocol.MinOutputWindow-1, "true"), "output window")

	for {
		n, exited := c.outputBytes("p")
		if exited {
			assert.Equal(t, size, n, "every byte, then the exit")
			break
		}
		if err := c.Call(protocol.AgentMethodCredit, protocol.CreditParams{ID: "p", Bytes: window}, nil); err != nil {
			c.WaitExit("p") // it ended between the check and the credit
			continue
		}
		time.Sleep(5 * time.Millisecond)
	}
	assert.Equal(t, "done\n", c.WaitExit("p").Stderr.String())
}

// TestShutdownLiftsCredit: a process blocked on credit still exits, with
// its exit reported, when the agent shuts down.
func TestShutdownLiftsCredit(t *testing.T) {
	c := startAgent(t, Options{})
	require.NoError(t, c.spawnWindow("p", protocol.MinOutputWindow, "sh", "-c", "yes 'some output'"))
	c.WaitFor("p", "output", func(p *agenttest.Output) bool { return p.Stdout.Len() > 0 })
	require.NoError(t, c.Call(protocol.AgentMethodShutdown, protocol.ShutdownParams{GraceMillis: 100}, nil))
	assert.NotNil(t, c.WaitExit("p").Exit)
}

// creditReturner gives back each output event's credit as the events come,
// as the helper does for a subscriber that keeps up.
func creditReturner(c *testClient, ids []string, window int64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		sent := map[string]int{}
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			for _, id := range ids {
				var used int64
				c.Locked(func(procs map[string]*agenttest.Output) {
					p := procs[id]
					if p == nil {
						return
					}
					for _, n := range p.Chunks[sent[id]:] {
						used += protocol.OutputCost(n)
					}
					if used >= window/4 || (used > 0 && p.Exit == nil) {
						sent[id] = len(p.Chunks)
					} else {
						used = 0
					}
				})
				if used > 0 {
					// Not waiting for the reply, as the helper's sender
					// does not hold one process's credit up for another's.
					wg.Go(func() { _ = c.Call(protocol.AgentMethodCredit, protocol.CreditParams{ID: id, Bytes: used}, nil) })
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// outputFlood runs procs processes printing size bytes each; window 0 is
// without flow control.
func outputFlood(b *testing.B, c *testClient, round, procs, size int, window int64) {
	ids := make([]string, procs)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%dp%d", round, i)
	}
	var stop func()
	if window > 0 {
		stop = creditReturner(c, ids, window)
		defer stop()
	}
	for _, id := range ids {
		require.NoError(b, c.spawnWindow(id, window, "sh", "-c", fmt.Sprintf("yes 'some typical output text' | head -c %d", size)))
	}
	for _, id := range ids {
		require.Equal(b, size, c.WaitExit(id).Stdout.Len())
		c.Locked(func(procs map[string]*agenttest.Output) { delete(procs, id) })
	}
}

// BenchmarkOutputFlood: 32 processes × 4 MiB of output reaching the
// helper without flow control (free) and with it (256 KiB windows, credit
// returned as the events arrive).
func BenchmarkOutputFlood(b *testing.B) {
	for _, mode := range []struct {
		name   string
		window int64
	}{{"free", 0}, {"credit", 256 << 10}, {"credit1M", 1 << 20}} {
		b.Run(mode.name, func(b *testing.B) {
			c := startAgent(b, Options{})
			b.SetBytes(32 * 4 << 20)
			round := 0
			for b.Loop() {
				outputFlood(b, c, round, 32, 4<<20, mode.window)
				round++
			}
		})
	}
}
