package agentrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// An agent that stops reading its connection holds no call past the call's
// context: not the one whose write stalls, nor one waiting for its turn
// behind it. The stream stays whole (a frame cut short mid-write is
// finished), so calls work again once the agent reads.
func TestAgentCallWritesAreBoundedByTheirContext(t *testing.T) {
	for name, readFirst := range map[string]int{"nothing read": 0, "mid-frame": 2} {
		t.Run(name, func(t *testing.T) {
			helperEnd, agentEnd := net.Pipe()
			t.Cleanup(func() { helperEnd.Close(); agentEnd.Close() })
			resume := make(chan struct{})
			go stalledAgent(agentEnd, readFirst, resume)
			c, err := Dial(context.Background(), helperEnd, slog.New(slog.DiscardHandler), nil)
			require.NoError(t, err)

			const bound = 100 * time.Millisecond
			errs := make(chan error, 2)
			began := time.Now()
			for range 2 {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), bound)
					defer cancel()
					errs <- c.Call(ctx, protocol.AgentMethodPing, nil, nil)
				}()
			}
			for range 2 {
				select {
				case err := <-errs:
					assert.ErrorIs(t, err, context.DeadlineExceeded)
				case <-time.After(5 * time.Second):
					t.Fatal("a call whose write stalled outlived its context by seconds")
				}
			}
			took := time.Since(began)
			t.Logf("two calls of %v against an agent that stopped reading returned after %v", bound, took.Round(time.Millisecond))
			assert.Less(t, took, 10*bound)

			close(resume)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.NoError(t, c.Call(ctx, protocol.AgentMethodPing, nil, nil), "a call once the agent reads again")
		})
	}
}

// stalledAgent says hello, reads the first readFirst bytes the helper
// writes, then nothing until resume; then it answers every request.
func stalledAgent(conn net.Conn, readFirst int, resume chan struct{}) {
	hello := protocol.AgentFrame{Kind: protocol.AgentKindHello, Hello: &protocol.AgentHello{Version: protocol.AgentProtocolVersion}}
	if protocol.WriteJSON(conn, hello) != nil {
		return
	}
	head := make([]byte, readFirst)
	if _, err := io.ReadFull(conn, head); err != nil {
		return
	}
	<-resume
	r := io.MultiReader(bytes.NewReader(head), conn)
	for {
		body, err := protocol.ReadFrame(r)
		if err != nil {
			return
		}
		var f protocol.AgentFrame
		if json.Unmarshal(body, &f) != nil {
			return
		}
		if protocol.WriteJSON(conn, protocol.AgentFrame{Kind: protocol.AgentKindReply, ID: f.ID}) != nil {
			return
		}
	}
}
