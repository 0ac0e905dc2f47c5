package protocol

// Event types sent to subscribers (and, for process events, by the agent).
const (
	EventStdout          = "stdout"
	EventStderr          = "stderr"
	EventExit            = "exit"
	EventError           = "error"
	EventNetworkStatus   = "networkStatus"
	EventAPIReachability = "apiReachability"
	EventStartupStep     = "startupStep"
	EventRequest         = "request"
)

// Event is one event frame. Only the fields of its Type are set; the JSON
// shapes are exactly those of PROTOCOL.md.
type Event struct {
	Type string `json:"type"`
	// ID is the spawn id (stdout, stderr, exit, error) or the guest request id (request).
	ID   string `json:"id,omitempty"`
	Data string `json:"data,omitempty"` // stdout, stderr

	ExitCode *int   `json:"exitCode,omitempty"` // exit
	Signal   string `json:"signal,omitempty"`   // exit
	// OOMKillCount (exit): how many processes the kernel's OOM killer
	// ended in the spawn's cgroup; absent when the guest cannot tell (no
	// cgroup of its own). At most MaxOOMKillCount.
	OOMKillCount *int `json:"oomKillCount,omitempty"`

	Message string `json:"message,omitempty"` // error
	Fatal   *bool  `json:"fatal,omitempty"`   // error

	Status string `json:"status,omitempty"` // networkStatus, apiReachability, startupStep
	Step   string `json:"step,omitempty"`   // startupStep

	Method string `json:"method,omitempty"` // request
	Params any    `json:"params,omitempty"` // request

	// GuestRequest is a request event's body on the agent channel only
	// (ID is then the spawn's id); the client's request events never carry
	// it. See GuestRequest.
	GuestRequest *GuestRequest `json:"guestRequest,omitempty"`
}

// MaxOOMKillCount bounds an exit's OOMKillCount (a count past it is not
// passed on): int32's range, exact in the client's JavaScript numbers.
const MaxOOMKillCount = 1<<31 - 1

// Status values.
const (
	NetworkConnected    = "CONNECTED"
	NetworkNotConnected = "NOT_CONNECTED"

	ReachabilityUnknown             = "unknown"
	ReachabilityReachable           = "reachable"
	ReachabilityProbablyUnreachable = "probably_unreachable"
	ReachabilityUnreachable         = "unreachable"

	StepStarted   = "started"
	StepCompleted = "completed"
	StepFailed    = "failed" // the step did not complete; an error follows
)
