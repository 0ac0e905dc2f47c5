package doctor

// Status is a check's outcome.
type Status string

// Check outcomes.
const (
	StatusOK   Status = "ok"   // works
	StatusWarn Status = "warn" // works, but something is worth changing
	StatusFail Status = "fail" // does not work; the fix says what to do
	StatusSkip Status = "skip" // not checked; the detail says why
)

// Groups of checks: what cowork-vmm itself needs, and what Claude Desktop's
// support gate looks at before it starts any helper.
const (
	GroupCoworkVMM = "cowork-vmm"
	GroupClient    = "client"
)

// Check IDs (stable: scripts and tests match on them).
const (
	CheckUser           = "user"
	CheckKVMDevice      = "kvm-device"
	CheckKVMAccess      = "kvm-access"
	CheckKVMAPI         = "kvm-api"
	CheckKVMCaps        = "kvm-capabilities"
	CheckKVMLinux       = "kvm-linux-guests"
	CheckKernel         = "guest-kernel"
	CheckFileSharing    = "file-sharing"
	CheckWarmStart      = "warm-start"
	CheckSuspended      = "suspended-guests"
	CheckFileLimit      = "file-limit"
	CheckRuntimeDir     = "runtime-dir"
	CheckSocketPath     = "socket-path"
	CheckUserNS         = "user-namespaces"
	CheckSeccomp        = "sandbox-seccomp"
	CheckDisk           = "disk-space"
	CheckRootDisks      = "root-disks"
	CheckUserland       = "guest-userland"
	CheckBootKVM        = "boot-kvm"
	CheckBootProcess    = "boot-process"
	CheckClientHelper   = "client-helper"
	CheckGateQEMU       = "gate-qemu"
	CheckGateFirmware   = "gate-firmware"
	CheckGateVirtiofsd  = "gate-virtiofsd"
	CheckGateKVM        = "gate-kvm"
	CheckGateVhostVsock = "gate-vhost-vsock"
)

// Backend names, as COWORK_VMM_BACKEND spells them.
const (
	BackendKVM     = "kvm"
	BackendProcess = "process"
)

// Check is one finding.
type Check struct {
	ID     string `json:"id"`
	Group  string `json:"group"`
	Title  string `json:"title"`
	Status Status `json:"status"`
	// Detail is the one-line finding.
	Detail string `json:"detail"`
	// Fix is what the user can do; empty when there is nothing to do.
	Fix string `json:"fix"`
}

// Verdict sums the checks up.
type Verdict struct {
	// DefaultBackend is the backend the helper uses: $COWORK_VMM_BACKEND,
	// else "kvm".
	DefaultBackend      string `json:"defaultBackend"`
	DefaultBackendWorks bool   `json:"defaultBackendWorks"`
	// UsableBackends lists every backend that can work here, best first.
	UsableBackends []string `json:"usableBackends"`
	// HelperCanServe is false when the socket cannot be served (runtime
	// directory or socket path unusable) or sessions have no disk space,
	// whatever the backend.
	HelperCanServe bool `json:"helperCanServe"`
	// ClientGatePasses says whether Claude Desktop's support gate will let
	// Cowork start on this host (it never dials any helper otherwise).
	ClientGatePasses bool `json:"clientGatePasses"`
	// ClientGate is what the gate will conclude, in words.
	ClientGate string `json:"clientGate"`
	// Summary is the verdict in one or two sentences.
	Summary string `json:"summary"`
}

// Report is everything doctor found.
type Report struct {
	Checks  []Check `json:"checks"`
	Verdict Verdict `json:"verdict"`
}

// ExitCode is doctor's exit status: 0 when the helper can serve and its
// default backend works, 1 otherwise. The client gate does not count: it
// is the client's to pass, reported separately.
func (r Report) ExitCode() int {
	if r.Verdict.DefaultBackendWorks && r.Verdict.HelperCanServe {
		return 0
	}
	return 1
}

// Check returns the check with id, and whether there is one.
func (r Report) Check(id string) (Check, bool) {
	for _, c := range r.Checks {
		if c.ID == id {
			return c, true
		}
	}
	return Check{}, false
}
