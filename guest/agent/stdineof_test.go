package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// End of input reaches the process: a cat reading its stdin ends once the
// data before it is written. timeout(1) bounds the wait when it does not.
func TestStdinEOFEndsTheProcesssInput(t *testing.T) {
	c := startAgent(t, Options{})
	c.spawn("cat", "timeout", "10", "sh", "-c", "cat; echo done")
	start := time.Now()
	require.NoError(t, c.Call(protocol.AgentMethodStdin, protocol.StdinParams{ID: "cat", Data: "last line\n", EOF: true}, nil))
	p := c.WaitExit("cat")
	require.Equal(t, "last line\ndone\n", p.Stdout.String())
	require.NotNil(t, p.Exit.ExitCode)
	require.Equal(t, 0, *p.Exit.ExitCode, "the process should end on its own, not by timeout(1)")
	t.Logf("ended %v after end of input", time.Since(start))
}

func TestStdinAfterEOFIsRefusedAndEOFTwiceIsNot(t *testing.T) {
	c := startAgent(t, Options{})
	c.spawn("sleep", "sleep", "30")
	require.NoError(t, c.Call(protocol.AgentMethodStdin, protocol.StdinParams{ID: "sleep", EOF: true}, nil))
	require.NoError(t, c.Call(protocol.AgentMethodStdin, protocol.StdinParams{ID: "sleep", EOF: true}, nil))
	require.ErrorContains(t, c.Call(protocol.AgentMethodStdin, protocol.StdinParams{ID: "sleep", Data: "x"}, nil), "its input has ended")
	require.NoError(t, c.Call(protocol.AgentMethodKill, protocol.KillParams{ID: "sleep", Signal: "SIGKILL"}, nil))
	c.WaitExit("sleep")
}
