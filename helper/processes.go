package helper

import (
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// maxExitedProcesses bounds how many finished processes are remembered for
// isProcessRunning; the oldest are forgotten first.
const maxExitedProcesses = 4096

// process is one spawned process as the helper tracks it.
type process struct {
	id       string
	session  string
	vm       *vmInstance
	running  bool
	exitCode *int
	signal   string
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
func (t *processTable) runningIn(vm *vmInstance) []*process {
	var out []*process
	for _, p := range t.byID {
		if p.running && p.vm == vm {
			out = append(out, p)
		}
	}
	return out
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
