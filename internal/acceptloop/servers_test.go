package acceptloop_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/egress"
	"github.com/cowork-vmm/cowork-vmm/internal/acceptloop/acceptlooptest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// The egress server's use of the loop is tested here, beside the loop, so
// that the egress package's tests stay its owner's; protocol.Server's is in
// protocol/server_idle_test.go.

func TestEgressServerRetriesTransientAcceptFailures(t *testing.T) {
	l := acceptlooptest.NewListener(
		acceptlooptest.AcceptError(syscall.EMFILE),
		acceptlooptest.AcceptError(syscall.ENFILE),
		acceptlooptest.AcceptError(syscall.EMFILE),
	)
	logs := &ratelogtest.LogBuffer{}
	srv := egress.NewServer(egress.Config{Logger: logs.Logger()}) // no spawn is registered
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background(), l) }()

	c := l.Dial()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	go func() {
		_ = protocol.WriteEgressRequest(c, protocol.EgressRequest{SpawnID: "s", Token: "t", Host: "example.com", Port: 443})
	}()
	rep, err := protocol.ReadEgressReply(c)
	require.NoError(t, err)
	assert.Contains(t, rep.Error, "no egress registered", "served after three failed accepts (and refused by policy)")
	assert.Contains(t, logs.String(), "accept failed; retrying")

	require.NoError(t, srv.Close())
	select {
	case err := <-done:
		assert.NoError(t, err, "Close is a clean stop")
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
}

func TestEgressServerStopsWithItsContext(t *testing.T) {
	l := acceptlooptest.NewListener(acceptlooptest.AcceptError(syscall.EMFILE))
	srv := egress.NewServer(egress.Config{})
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	select {
	case <-l.Closed():
	case <-time.After(20 * time.Second):
		t.Fatal("the listener was not closed")
	}
}
