package helper

import "time"

// pingBusyFatal bounds how many pings in a row a busy guest may leave
// unanswered (busyNotDead says it is busy each time) before it is
// declared dead all the same: an agent that still sends output but
// answers no request at all is of no use to the client. At the default
// interval it is about six minutes.
const pingBusyFatal = 30

// progressMark is what a guest said of its progress before a ping.
type progressMark struct {
	count uint64
	ok    bool // the guest reports progress (ProgressReporter)
}

// progress reads the guest's progress count, if it reports one.
func (inst *guestInstance) progress() progressMark {
	r, ok := inst.guest.(ProgressReporter)
	if !ok {
		return progressMark{}
	}
	count, ok := r.Progress()
	return progressMark{count: count, ok: ok}
}

// busyNotDead reports whether a guest whose ping, sent at pingStart, went
// unanswered is busy rather than dead: its agent sent a frame since (an
// event, a late reply), and, if the guest reports progress, its vCPUs ran
// meanwhile. An agent gone silent is dead however busy the vCPUs are (a
// spawn can keep them busy after the agent hung), and vCPUs that stopped
// run no agent.
func (inst *guestInstance) busyNotDead(pingStart time.Time, before progressMark) bool {
	if !inst.agent.LastReceived().After(pingStart) {
		return false
	}
	if !before.ok {
		return true
	}
	after := inst.progress()
	return after.ok && after.count != before.count
}
