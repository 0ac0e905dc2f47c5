package helper

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc"
)

// Suspend at stopVM, resume at startVM (Suspender). A guest that can be
// suspended is asked to, instead of shutting down: its processes end as
// at a shutdown (their exit events go out), and the guest is saved with
// its root set up, so that the next startVM neither boots nor sets up.
// Anything that fails falls back to the shutdown, or to a cold start.

const (
	// suspendAgentMargin is how long, past the grace period, the agent
	// has to end its mounts, sync its disks and drop its caches.
	suspendAgentMargin = 30 * time.Second
	// suspendSaveTimeout bounds the save of the guest.
	suspendSaveTimeout = 2 * time.Minute
)

// trySuspend suspends the guest when it can be: tried says whether the
// agent took the request (it has then closed its channel: the guest can
// only be stopped, saved or not). false: shut the guest down instead.
func (inst *guestInstance) trySuspend(guest Guest, agent *agentrpc.Client) (tried bool) {
	log := inst.s.log
	sus, ok := guest.(Suspender)
	if !ok {
		return false
	}
	if err := sus.PrepareSuspend(); err != nil {
		log.Info("stopVM shuts the guest down instead of suspending it", "reason", err)
		return false
	}
	began := time.Now()
	grace := inst.s.opts.StopGrace
	askCtx, cancelAsk := context.WithTimeout(context.Background(), grace+suspendAgentMargin)
	err := askFinal(askCtx, agent, protocol.AgentMethodSuspend, protocol.SuspendParams{GraceMillis: int(grace / time.Millisecond)})
	cancelAsk()
	if err != nil {
		log.Warn("the guest agent did not suspend; shutting the guest down", "err", err)
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), suspendSaveTimeout)
	defer cancel()
	state, err := sus.Suspend(ctx)
	if err != nil {
		log.Warn("the guest was not saved; the next startVM boots it", "err", err)
		return true
	}
	log.Info("guest suspended", "path", state.Path, "bytes", state.Bytes, "save", state.Took.Round(time.Millisecond),
		"stopVM", time.Since(began).Round(time.Millisecond))
	return true
}

// resumed says whether guest was resumed from a suspended state.
func resumed(guest Guest) bool {
	sus, ok := guest.(Suspender)
	return ok && sus.Resumed()
}

// resumeRoot is setUpRoot for a resumed guest: its root is set up
// already; the agent steps its clock and says what its setup did.
func (inst *guestInstance) resumeRoot() error {
	began := time.Now()
	seed := make([]byte, 64)
	_, _ = rand.Read(seed)
	var result protocol.SetupResult
	if err := inst.call(protocol.AgentMethodResume, protocol.ResumeParams{ClockUnixNano: time.Now().UnixNano(), Seed: seed}, &result); err != nil {
		return fmt.Errorf("resuming the suspended guest: %w", err)
	}
	inst.sessionTmp.Store(result.SessionTmp)
	attrs := []any{"took", time.Since(began).Round(time.Microsecond), "rootDisk", result.RootDisk}
	for _, step := range result.Steps {
		attrs = append(attrs, "agent."+step.Name, time.Duration(step.Micros)*time.Microsecond)
	}
	inst.s.log.Info("guest resumed", attrs...)
	return nil
}
