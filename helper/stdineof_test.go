package helper

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// writeStdin's eof (our extension) reaches the agent: the fake's cat ends
// with its input.
func TestWriteStdinEOFEndsTheProcesssInput(t *testing.T) {
	e := newTestEnv(t)
	e.start()
	e.spawn(map[string]any{"id": "cat", "name": "sess", "command": "cat"})
	e.mustCall("writeStdin", map[string]any{"id": "cat", "data": "last\n", "eof": true}, nil)
	assert.Equal(t, "last\n", e.next(protocol.EventStdout).Data)
	ev := e.next(protocol.EventExit)
	require.NotNil(t, ev.ExitCode)
	assert.Equal(t, 0, *ev.ExitCode)
}
