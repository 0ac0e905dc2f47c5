package bench

import (
	"time"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Marks are the instants of one run, taken on the client side. Startup
// steps come from the helper's startupStep events, stamped when received.
const (
	MarkExec        = "exec"         // the helper process (or qemu) was started
	MarkSocket      = "socket"       // the helper's socket accepted a connection
	MarkStartSent   = "start_sent"   // startVM was sent (qemu: exec)
	MarkStartReply  = "start_reply"  // startVM replied (the guest is launched)
	MarkVMCreated   = "vm_created"   // step vm_create completed
	MarkVCPUStarted = "vcpu_started" // step kernel_load completed: vCPUs run the kernel's first instruction
	MarkInit        = "init"         // the boot timer fired: the guest's /init runs (step guest_boot completed)
	MarkAgentDialed = "agent_dialed" // step agent_connect completed: the agent's vsock connection was accepted
	MarkHello       = "hello"        // step agent_hello completed: the helper read the agent's hello
	MarkRootSetUp   = "root_set_up"  // step guest_setup completed: the system directories are shared and mounted
	MarkConnected   = "connected"    // isGuestConnected first answered true (hello and setup done)
	MarkSpawnSent   = "spawn_sent"   // spawn /bin/true was sent
	MarkExit        = "exit"         // its exit event arrived
	MarkEchoSent    = "echo_sent"    // spawn echo was sent
	MarkFirstStdout = "first_stdout" // its first stdout event arrived
	MarkStopSent    = "stop_sent"    // stopVM was sent
	MarkGone        = "gone"         // isRunning first answered false
)

// Startup step names the kvm backend (helper/backend/vm) reports; the timeline maps
// their "completed" events to marks.
const (
	stepVMCreate   = "vm_create"
	stepKernelLoad = "kernel_load"
	stepGuestBoot  = "guest_boot"
	stepAgentDial  = "agent_connect"
)

// stepMarks maps a completed startup step to its mark: the kvm backend's,
// then the helper's own inside connect_agent.
var stepMarks = map[string]string{
	stepVMCreate:          MarkVMCreated,
	stepKernelLoad:        MarkVCPUStarted,
	stepGuestBoot:         MarkInit,
	stepAgentDial:         MarkAgentDialed,
	helper.StepAgentHello: MarkHello,
	helper.StepGuestSetup: MarkRootSetUp,
}

// Phase is a span between two marks.
type Phase struct {
	ID    string `json:"id"`
	Label string `json:"label"`
	From  string `json:"from"`
	To    string `json:"to"`
	// Peer: qemu measures this phase too, so it gets a ratio.
	Peer bool `json:"peer,omitempty"`
}

// Phases is every phase reported, in the order of a start. A run reports a
// phase only when it has both marks (the process backend has no VM
// phases; qemu has only start → /init).
var Phases = []Phase{
	{ID: "helper_start", Label: "helper start → socket bound", From: MarkExec, To: MarkSocket},
	{ID: "vm_create", Label: "startVM → VM created", From: MarkStartSent, To: MarkVMCreated},
	{ID: "vcpu_start", Label: "VM created → first guest instruction", From: MarkVMCreated, To: MarkVCPUStarted},
	{ID: "kernel_boot", Label: "kernel entry → /init (boot timer)", From: MarkVCPUStarted, To: MarkInit},
	{ID: "start_to_init", Label: "start → /init (total)", From: MarkStartSent, To: MarkInit, Peer: true},
	{ID: "start_reply", Label: "startVM → reply (launched)", From: MarkStartSent, To: MarkStartReply},
	{ID: "agent_dial", Label: "/init → agent dialed over vsock", From: MarkInit, To: MarkAgentDialed},
	{ID: "agent_setup", Label: "agent dialed → set up (hello, mounts)", From: MarkAgentDialed, To: MarkConnected},
	{ID: "agent_hello", Label: "agent dialed → hello read", From: MarkAgentDialed, To: MarkHello},
	{ID: "guest_setup", Label: "hello → root set up (share, mount)", From: MarkHello, To: MarkRootSetUp},
	{ID: "connected_poll", Label: "root set up → isGuestConnected true", From: MarkRootSetUp, To: MarkConnected},
	{ID: "agent_connect", Label: "/init → agent connected", From: MarkInit, To: MarkConnected},
	{ID: "start_to_connected", Label: "startVM → agent connected (total)", From: MarkStartSent, To: MarkConnected},
	{ID: "spawn_exit", Label: "spawn /bin/true → exit event", From: MarkSpawnSent, To: MarkExit},
	{ID: "echo_first_byte", Label: "spawn echo → first stdout byte", From: MarkEchoSent, To: MarkFirstStdout},
	{ID: "stop", Label: "stopVM → VM gone", From: MarkStopSent, To: MarkGone},
}

// Timeline collects the marks of one run. The first time a mark is set
// wins. Not safe for concurrent use.
type Timeline struct {
	marks map[string]time.Time
}

// NewTimeline returns an empty timeline.
func NewTimeline() *Timeline { return &Timeline{marks: make(map[string]time.Time)} }

// Mark records name at at, unless it is recorded already.
func (t *Timeline) Mark(name string, at time.Time) {
	if _, ok := t.marks[name]; !ok {
		t.marks[name] = at
	}
}

// At returns a mark's time.
func (t *Timeline) At(name string) (time.Time, bool) {
	at, ok := t.marks[name]
	return at, ok
}

// OnEvent records the marks an event received at at carries: completed
// startup steps, the first exit of exitID and the first stdout of echoID.
func (t *Timeline) OnEvent(ev protocol.Event, at time.Time, exitID, echoID string) {
	switch ev.Type {
	case protocol.EventStartupStep:
		if ev.Status == protocol.StepCompleted {
			if mark, ok := stepMarks[ev.Step]; ok {
				t.Mark(mark, at)
			}
		}
	case protocol.EventExit:
		if exitID != "" && ev.ID == exitID {
			t.Mark(MarkExit, at)
		}
	case protocol.EventStdout:
		if echoID != "" && ev.ID == echoID && ev.Data != "" {
			t.Mark(MarkFirstStdout, at)
		}
	}
}

// Durations returns every phase whose two marks are set, by phase id. A
// phase whose end precedes its start (events reordered in flight) is left
// out rather than reported negative.
func (t *Timeline) Durations() map[string]time.Duration {
	out := make(map[string]time.Duration)
	for _, p := range Phases {
		from, ok1 := t.marks[p.From]
		to, ok2 := t.marks[p.To]
		if ok1 && ok2 && !to.Before(from) {
			out[p.ID] = to.Sub(from)
		}
	}
	return out
}
