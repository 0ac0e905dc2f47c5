package agent

import (
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// stepTimer times the consecutive steps of one piece of work (setup), so
// the helper can log where a guest's start spends its time.
type stepTimer struct {
	last  time.Time
	steps []protocol.TimedStep
}

func newStepTimer() *stepTimer { return &stepTimer{last: time.Now()} }

// done ends the step called name, begun when the previous one ended.
// A nil timer records nothing.
func (t *stepTimer) done(name string) {
	if t == nil {
		return
	}
	now := time.Now()
	t.steps = append(t.steps, protocol.TimedStep{Name: name, Micros: now.Sub(t.last).Microseconds()})
	t.last = now
}
