package helper

// Output flow control. Every process is spawned with an output window
// (protocol.SpawnParams.OutputWindow): the agent sends its output only
// while it has credit, and stops reading its pipes otherwise, so the
// process blocks on them. The helper gives credit back as the profile's
// subscriber writes the output events to its client (Hub.onDelivered):
// with a slow subscriber the process runs at the client's pace; with none
// it waits. The agent connection is never held up: its read loop only
// publishes, and a process past its credit is the agent's to stop.
//
// Memory: a process holds at most outputWindow plus one event of output
// (a guest that sends more is hostile, and the excess is dropped), and a
// profile runs at most maxRunningProcesses, so output holds at most
// maxOutputHeld of the hub's MaxBacklogBytes; guest requests get
// guestRequestBudget of the rest, exits and errors the remainder.

import (
	"context"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const (
	// outputWindow is each process's credit: 256 KiB keeps a fast
	// producer streaming while its subscriber writes.
	outputWindow = 256 << 10
	// maxOutputEventCost is the most credit one output event from the
	// agent may use: a chunk, a carried-over UTF-8 character, overhead.
	maxOutputEventCost = protocol.MaxOutputChunkBytes + 3 + protocol.OutputEventOverhead
	// maxRunningProcesses bounds a profile's running processes.
	maxRunningProcesses = 64
	// maxOutputHeld is what all a profile's output may hold in its hub.
	maxOutputHeld = maxRunningProcesses * (outputWindow + maxOutputEventCost)
	// guestRequestBudget bounds the events owed to the client when a guest
	// request is published: the hub's cap less output's share and 1 MiB
	// for exits, errors and status events.
	guestRequestBudget = MaxBacklogBytes - maxOutputHeld - 1<<20
	// creditBatch: credit goes back once this much has been delivered,
	// not per event (never more than the window, so a process waiting for
	// its whole window still gets it).
	creditBatch = outputWindow / 4
)

// takeOutputCredit records that process p's agent used cost credit for an
// output event, and reports false when the agent had none left: a guest
// ignoring its window, whose output is dropped. lifted: the window no
// longer applies (the guest is being stopped). Called with s.mu held.
func (p *process) takeOutputCredit(cost int64, lifted bool) bool {
	if !lifted && (cost > maxOutputEventCost || p.outputHeld >= outputWindow) {
		return false
	}
	p.outputHeld += cost
	return true
}

// outputDelivered gives back the credit of an output event of process id
// that has been delivered (Hub.onDelivered): to the agent once creditBatch
// of it has gathered.
func (s *Service) outputDelivered(id string, credit int) {
	s.mu.Lock()
	p := s.procs.get(id)
	if p == nil || !p.running {
		s.mu.Unlock()
		return // its output is over
	}
	p.outputHeld -= int64(credit)
	p.creditDue += int64(credit)
	due := p.creditDue
	if due < creditBatch {
		s.mu.Unlock()
		return
	}
	p.creditDue = 0
	inst := p.guest
	s.mu.Unlock()
	inst.credits.give(inst, id, due)
}

// creditSender sends a guest's credit to its agent, from one goroutine:
// the hub's subscribers never wait for the agent, and credit for a process
// gathers while a request is out.
type creditSender struct {
	once    sync.Once
	mu      sync.Mutex
	pending map[string]int64
	wake    chan struct{}
}

// give queues credit for process id of inst's agent.
func (c *creditSender) give(inst *guestInstance, id string, bytes int64) {
	c.once.Do(func() {
		c.pending = make(map[string]int64)
		c.wake = make(chan struct{}, 1)
		go c.run(inst)
	})
	c.mu.Lock()
	c.pending[id] += bytes
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run sends the queued credit until the guest ends.
func (c *creditSender) run(inst *guestInstance) {
	ctx := inst.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	for {
		select {
		case <-c.wake:
		case <-ctx.Done():
			return
		}
		c.mu.Lock()
		batch := c.pending
		c.pending = make(map[string]int64)
		c.mu.Unlock()
		// At once, one call per process (at most maxRunningProcesses): a
		// reply queues behind the agent's output, and one process's
		// credit must not wait for another's.
		var wg sync.WaitGroup
		for id, bytes := range batch {
			wg.Go(func() { giveCredit(inst, id, bytes) })
		}
		wg.Wait()
	}
}

// giveCredit sends one process's credit.
func giveCredit(inst *guestInstance, id string, bytes int64) {
	for bytes > 0 {
		n := min(bytes, protocol.MaxOutputWindow)
		bytes -= n
		if err := inst.call(protocol.AgentMethodCredit, protocol.CreditParams{ID: id, Bytes: n}, nil); err != nil {
			// The process has ended, or the guest: nobody to give it to.
			inst.s.log.Debug("output credit not given", "id", id, "err", err)
			return
		}
	}
}
