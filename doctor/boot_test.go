package doctor

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// fakeBackend starts guests whose agent sends first.
type fakeBackend struct {
	startErr error
	first    any // the agent's first frame; nil sends nothing
	stopped  atomic.Int32
}

func (b *fakeBackend) Name() string { return "fake" }

func (b *fakeBackend) Start(ctx context.Context, cfg helper.GuestConfig) (helper.Guest, error) {
	if b.startErr != nil {
		return nil, b.startErr
	}
	return &fakeGuest{b: b, done: make(chan struct{})}, nil
}

type fakeGuest struct {
	b    *fakeBackend
	done chan struct{}
}

func (g *fakeGuest) Agent(ctx context.Context) (io.ReadWriteCloser, error) {
	ours, agent := net.Pipe()
	go func() {
		if g.b.first != nil {
			_ = protocol.WriteJSON(agent, g.b.first)
		}
		<-g.done
		agent.Close()
	}()
	return ours, nil
}

func (g *fakeGuest) Share(string, bool) (protocol.MountSource, error) {
	return protocol.MountSource{}, errors.New("not in this fake")
}
func (g *fakeGuest) Unshare(protocol.MountSource) {}
func (g *fakeGuest) Egress() net.Listener         { return nil }
func (g *fakeGuest) Done() <-chan struct{}        { return g.done }
func (g *fakeGuest) Err() error                   { return nil }
func (g *fakeGuest) Stop(context.Context) error {
	if g.b.stopped.Add(1) == 1 {
		close(g.done)
	}
	return nil
}

func TestBootAndGreet(t *testing.T) {
	b := &fakeBackend{first: protocol.AgentFrame{Kind: protocol.AgentKindHello, Hello: &protocol.AgentHello{Version: 1, Kernel: "6.1.5"}}}
	res, err := bootAndGreet(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if res.Kernel != "6.1.5" || res.Elapsed <= 0 {
		t.Errorf("result %+v", res)
	}
	if b.stopped.Load() == 0 {
		t.Error("the trial guest was not stopped")
	}

	b = &fakeBackend{first: protocol.AgentFrame{Kind: "event"}}
	if _, err := bootAndGreet(context.Background(), b); err == nil || !strings.Contains(err.Error(), `want "hello"`) {
		t.Errorf("first frame not hello: err %v", err)
	}
	if b.stopped.Load() == 0 {
		t.Error("the trial guest was not stopped after a bad hello")
	}

	b = &fakeBackend{startErr: errors.New("no KVM device")}
	if _, err := bootAndGreet(context.Background(), b); err == nil || !strings.Contains(err.Error(), "no KVM device") {
		t.Errorf("start error: err %v", err)
	}

	// An agent that never speaks: the context ends the wait.
	b = &fakeBackend{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := bootAndGreet(ctx, b); !errors.Is(err, context.Canceled) {
		t.Errorf("silent agent: err %v, want context.Canceled", err)
	}
}

func TestTailWriter(t *testing.T) {
	w := &tailWriter{max: 32}
	for _, s := range []string{"first line\n", "second\n\n", "third line is long enough to push out\n", "last\n"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if len(w.buf) > 32 {
		t.Errorf("kept %d bytes, max 32", len(w.buf))
	}
	got := w.lastLines(2)
	if !strings.HasSuffix(got, " | last") || strings.Contains(got, "first") {
		t.Errorf("lastLines(2) = %q", got)
	}
	if (&tailWriter{max: 8}).lastLines(3) != "" {
		t.Error("empty writer has lines")
	}
}
