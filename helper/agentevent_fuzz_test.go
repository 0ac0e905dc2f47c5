package helper

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// FuzzAgentEvent feeds arbitrary agent events (the guest is hostile) to the
// helper: it must never panic, and only events of a process the helper
// spawned in that guest, of the four process types, reach subscribers.
func FuzzAgentEvent(f *testing.F) {
	for _, s := range []string{
		`{"type":"stdout","id":"p","data":"hi"}`,
		`{"type":"exit","id":"p","exitCode":300}`,
		`{"type":"exit","id":"p","signal":"SIGBOGUS"}`,
		`{"type":"exit","id":"p","exitCode":-1,"oomKillCount":2}`,
		`{"type":"error","id":"p","message":"m","fatal":true}`,
		`{"type":"request","id":"p","method":"x"}`,
		`{"type":"stdout","id":"other","data":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ev protocol.Event
		if json.Unmarshal(raw, &ev) != nil {
			return
		}
		h, err := New(Options{DataDir: t.TempDir(), Backlog: 16})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close(context.Background())
		s, err := h.Profile("x", "y")
		if err != nil {
			t.Fatal(err)
		}
		inst := &guestInstance{s: s}
		s.procs.add(&process{id: "p", session: "s", guest: inst, running: true})
		sub := s.hub.Subscribe()
		s.onAgentEvent(inst, ev)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for {
			out, err := sub.Next(ctx)
			if err != nil {
				break
			}
			if out.ID != "p" {
				t.Fatalf("event for %q published", out.ID)
			}
			switch out.Type {
			case protocol.EventStdout, protocol.EventStderr, protocol.EventError:
			case protocol.EventExit:
				if (out.ExitCode == nil) == (out.Signal == "") {
					t.Fatalf("exit must carry exactly one of exitCode and signal: %+v", out)
				}
				if out.ExitCode != nil && (*out.ExitCode < 0 || *out.ExitCode > 255) {
					t.Fatalf("exit code out of range: %d", *out.ExitCode)
				}
				if canon, err := protocol.CanonicalSignal(out.Signal); out.Signal != "" && (err != nil || canon != out.Signal) {
					t.Fatalf("signal %q published, not a canonical signal name", out.Signal)
				}
			default:
				t.Fatalf("event type %q published", out.Type)
			}
			if len(out.Message) > maxErrorMessage+len("…") {
				t.Fatalf("message of %d bytes", len(out.Message))
			}
			if len(out.Data) > maxEventData {
				t.Fatalf("data of %d bytes in one event", len(out.Data))
			}
		}
	})
}
