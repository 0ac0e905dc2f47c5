package helper

import (
	"context"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// maxExitedProcesses bounds how many finished processes are remembered for
// isProcessRunning; the oldest are forgotten first.
const maxExitedProcesses = 4096

// process is one spawned process as the helper tracks it.
type process struct {
	id       string
	session  string
	guest    *guestInstance
	running  bool
	exitCode *int
	signal   string
	// outputHeld is the output credit its agent has used and not had back
	// (flow.go); creditDue what has been delivered and not yet given back.
	outputHeld int64
	creditDue  int64
	// outputOverrun: output was dropped for want of credit (logged once).
	outputOverrun bool
}

// processTable is guarded by Service.mu.
type processTable struct {
	byID   map[string]*process
	exited []string // ids of finished processes, oldest first
}

func (t *processTable) init() { t.byID = make(map[string]*process) }

func (t *processTable) get(id string) *process { return t.byID[id] }

// add registers a running process, replacing a finished one of the same id.
func (t *processTable) add(p *process) {
	if old := t.byID[p.id]; old != nil && !old.running {
		t.dropExited(p.id)
	}
	t.byID[p.id] = p
}

// remove forgets a process whose spawn failed.
func (t *processTable) remove(p *process) {
	if t.byID[p.id] == p {
		delete(t.byID, p.id)
	}
}

// markExited records an exit and returns false if the process had already
// exited (a duplicate exit is dropped).
func (t *processTable) markExited(p *process, exitCode *int, signal string) bool {
	if !p.running {
		return false
	}
	p.running = false
	p.exitCode = exitCode
	p.signal = signal
	t.exited = append(t.exited, p.id)
	for len(t.exited) > maxExitedProcesses {
		victim := t.exited[0]
		t.exited = t.exited[1:]
		if q := t.byID[victim]; q != nil && !q.running {
			delete(t.byID, victim)
		}
	}
	return true
}

func (t *processTable) dropExited(id string) {
	for i, e := range t.exited {
		if e == id {
			t.exited = append(t.exited[:i], t.exited[i+1:]...)
			return
		}
	}
}

// runningIn lists running processes of one guest.
func (t *processTable) runningIn(inst *guestInstance) []*process {
	var out []*process
	for _, p := range t.byID {
		if p.running && p.guest == inst {
			out = append(out, p)
		}
	}
	return out
}

// running counts the running processes.
func (t *processTable) running() int {
	n := 0
	for _, p := range t.byID {
		if p.running {
			n++
		}
	}
	return n
}

// sessionBusy says whether a session has a running process.
func (t *processTable) sessionBusy(name string) bool {
	for _, p := range t.byID {
		if p.running && p.session == name {
			return true
		}
	}
	return false
}

// busySessions is the set of sessions with a running process.
func (t *processTable) busySessions() map[string]bool {
	out := map[string]bool{}
	for _, p := range t.byID {
		if p.running {
			out[p.session] = true
		}
	}
	return out
}

// exitEvent is the client event for a finished process.
func exitEvent(p *process) protocol.Event {
	ev := protocol.Event{Type: protocol.EventExit, ID: p.id}
	if p.signal != "" {
		ev.Signal = p.signal
	} else {
		code := 0
		if p.exitCode != nil {
			code = *p.exitCode
		}
		ev.ExitCode = &code
	}
	return ev
}

// runningProcess returns a running process and its guest.
func (s *Service) runningProcess(id string) (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs.get(id)
	if p == nil {
		return nil, fmt.Errorf("no process with id %q", id)
	}
	if !p.running {
		return nil, fmt.Errorf("process %q has already exited", id)
	}
	return p, nil
}

func (s *Service) kill(_ context.Context, p protocol.ClientKillParams) (empty, error) {
	sig := "SIGTERM"
	if p.Signal != "" {
		var err error
		if sig, err = protocol.CanonicalSignal(p.Signal); err != nil {
			return nil, fmt.Errorf("kill: %w", err)
		}
	}
	s.mu.Lock()
	proc := s.procs.get(p.ID)
	s.mu.Unlock()
	if proc == nil {
		return nil, fmt.Errorf("kill: no process with id %q", p.ID)
	}
	s.mu.Lock()
	running := proc.running
	s.mu.Unlock()
	if !running {
		return nil, nil // already gone: the exit event has been sent
	}
	if err := proc.guest.call(protocol.AgentMethodKill, protocol.KillParams{ID: p.ID, Signal: sig}, nil); err != nil {
		return nil, fmt.Errorf("kill: %w", err)
	}
	s.log.Info("signalled", "id", p.ID, "signal", sig)
	return nil, nil
}

func (s *Service) writeStdin(_ context.Context, p protocol.WriteStdinParams) (empty, error) {
	proc, err := s.runningProcess(p.ID)
	if err != nil {
		return nil, fmt.Errorf("writeStdin: %w", err)
	}
	if err := proc.guest.call(protocol.AgentMethodStdin, protocol.StdinParams{ID: p.ID, Data: p.Data, EOF: p.EOF}, nil); err != nil {
		return nil, fmt.Errorf("writeStdin: %w", err)
	}
	return nil, nil
}

func (s *Service) isProcessRunning(_ context.Context, p protocol.IsProcessRunningParams) (protocol.IsProcessRunningResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	proc := s.procs.get(p.ID)
	if proc == nil {
		return protocol.IsProcessRunningResult{}, nil
	}
	if proc.running {
		return protocol.IsProcessRunningResult{Running: true}, nil
	}
	res := protocol.IsProcessRunningResult{}
	if proc.exitCode != nil {
		res.ExitCode = ptr(*proc.exitCode)
	} else if sig, err := protocol.ParseSignal(proc.signal); err == nil {
		res.ExitCode = ptr(128 + int(sig)) // as a shell reports a signal death
	}
	return res, nil
}
