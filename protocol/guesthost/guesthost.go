package guesthost

// vsock: the agent and the guest proxy dial the host (CID 2,
// VMADDR_CID_HOST); the host listens.
const (
	// AgentVSockPort is the host vsock port the agent dials: the helper ↔
	// agent channel (protocol/agent.go).
	AgentVSockPort = 1024
	// EgressVSockPort is the host vsock port the guest proxy dials for each
	// outbound connection (protocol/egress.go).
	EgressVSockPort = 1025
)

// DebugCmdlineFlag on the guest kernel's command line turns on the
// agent's debug log on the serial console.
const DebugCmdlineFlag = "cowork.debug"

// The boot timer (devices/platform.BootTimer): the agent writes
// BootTimerMagic to I/O port BootTimerPort as soon as it starts, so the
// VMM can measure the guest's boot (the port is Firecracker's).
const (
	BootTimerPort  = 0x3f0
	BootTimerMagic = 123
)

// Where the boot timer and the snapshot point are on arm64, which has no
// I/O ports: a page of guest-physical MMIO space each, below RAM, beside
// the console (vmm/arm64's layout). The device tree does not list them, so
// no guest driver claims them; the agent maps them through /dev/mem. A
// register's offset in its page is its port's offset in its x86 window.
const (
	BootTimerMMIO     = 0x0901_0000
	SnapshotPointMMIO = 0x0902_0000
)

// The snapshot point (devices/platform.SnapshotPoint): an I/O port through
// which the agent says it has started and dialled nothing yet (the moment
// a snapshot is worth taking), and learns when to go on and whether it
// runs in a VM restored from that snapshot.
const (
	// SnapshotPointPort is the port, next to the boot timer's.
	SnapshotPointPort = 0x3f4
	// SnapshotPointArrive is what the guest writes on arriving.
	SnapshotPointArrive = 1
)

// What a read of the snapshot point says. Any other value (0 or 0xff: no
// device) means go on: a VMM without the device never holds the guest.
const (
	SnapshotPointWait     = 0x10 // stay: the VMM is taking the snapshot
	SnapshotPointGo       = 0x11 // go on: this VM booted cold
	SnapshotPointRestored = 0x12 // go on: this VM was restored from a snapshot
)

// An egress refusal. The helper's egress server starts the error of its
// reply with one of the two words; the guest proxy answers the process's
// request with 403 and sets EgressRefusalHeader to that word.
const (
	// EgressRefusalHeader is the HTTP header of the guest proxy's 403.
	EgressRefusalHeader = "X-Cowork-Egress"
	// EgressBlockedByAllowlist: the spawn's allowedDomains refuse the host.
	EgressBlockedByAllowlist = "blocked-by-allowlist"
	// EgressBlockedByAddressFilter: the policy allowed the host, but every
	// address it leads to is one the guest may not reach (the host itself,
	// link-local, a private range).
	EgressBlockedByAddressFilter = "blocked-by-address-filter"
)
