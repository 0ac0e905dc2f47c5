package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The helper ↔ guest-agent channel.
//
// The agent (PID 1 in the VM, or the init of a namespace sandbox in the
// process backend) holds one connection to the helper: a vsock stream in the
// VM, an inherited socketpair in the process backend. Both directions use the
// same frame codec as the client socket (ReadFrame/WriteFrame) and carry one
// AgentFrame each.
//
// Conversation:
//  1. The agent connects and sends an AgentFrame with Kind "hello" and Hello set.
//  2. The helper sends requests (Kind "request", ID > 0, Method, Params). The
//     agent answers each with Kind "reply", the same ID, and either Result or
//     Error. Requests are handled concurrently; replies may come out of order.
//  3. The agent sends events (Kind "event", Event set) at any time after hello:
//     process output, exits, errors.
//  4. The helper ends the guest with the "shutdown" request; the agent replies,
//     ends every process (SIGTERM, then SIGKILL after ShutdownParams.GraceMillis)
//     and then powers off (VM) or exits (process backend).
//
// Guest requests (a spawned process asking the desktop client something)
// ride on the same channel: the agent sends an event of type EventRequest
// whose ID is the spawn's and whose GuestRequest carries the agent's number
// for it; the helper answers with the guestResponse request naming that
// number (GuestResponseParams), after the client's sendGuestResponse or its
// timeout. See GuestCall for the guest's side.

// In the VM the agent dials host vsock port guesthost.AgentVSockPort.

// AgentProtocolVersion is bumped on any incompatible change to these types.
const AgentProtocolVersion = 1

// Frame kinds on the agent channel.
const (
	AgentKindHello   = "hello"
	AgentKindRequest = "request"
	AgentKindReply   = "reply"
	AgentKindEvent   = "event"
)

// Methods the helper calls on the agent.
const (
	AgentMethodSetup    = "setup"    // SetupParams → SetupResult
	AgentMethodMount    = "mount"    // MountParams → no result
	AgentMethodSpawn    = "spawn"    // SpawnParams → no result
	AgentMethodStdin    = "stdin"    // StdinParams → no result
	AgentMethodKill     = "kill"     // KillParams → no result
	AgentMethodReadFile = "readFile" // ReadFileParams → ReadFileResult
	AgentMethodPing     = "ping"     // no params → no result
	AgentMethodShutdown = "shutdown" // ShutdownParams → no result
	// AgentMethodUnmount removes a mount the agent made (UnmountParams → no
	// result): a session's mounts that a fresh spawn, or the end of a
	// oneShot process, leaves behind.
	AgentMethodUnmount = "unmount"
	// AgentMethodGuestResponse answers a guest request
	// (GuestResponseParams → no result; an error when its caller is gone).
	AgentMethodGuestResponse = "guestResponse"
	// AgentMethodPruneTmp removes old entries of sessions' /tmp on the
	// root disk, or a session's /tmp whole (PruneTmpParams →
	// PruneTmpResult): pruneSessionCaches and deleteSessionDirs for what
	// the host cannot reach, the guest's disk.
	AgentMethodPruneTmp = "pruneTmp"
	// AgentMethodCredit lets a process send more output (CreditParams →
	// no result; an error when it is no longer running). See OutputWindow.
	AgentMethodCredit = "credit"
	// AgentMethodSuspend readies the guest to be saved and ends the
	// channel (SuspendParams → no result; see SuspendParams). Only the kvm
	// backend's agent serves it; the helper shuts down a guest whose agent
	// refuses it.
	AgentMethodSuspend = "suspend"
	// AgentMethodResume is a resumed guest's setup: the root it was set
	// up with is still in place (ResumeParams → SetupResult, the result
	// of its first setup with this resume's steps).
	AgentMethodResume = "resume"
)

// AgentFrame is the one envelope on the agent channel.
type AgentFrame struct {
	Kind   string          `json:"kind"`
	ID     uint64          `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	Hello  *AgentHello     `json:"hello,omitempty"`
	Event  *Event          `json:"event,omitempty"`
}

// AgentHello is the agent's first frame.
type AgentHello struct {
	Version int    `json:"version"`
	Kernel  string `json:"kernel,omitempty"` // uname release, for logs
	PID     int    `json:"pid"`
}

// MountSource says where a mount's content comes from; which kind a backend
// uses is the backend's business, the agent just performs it.
type MountSource struct {
	// Kind is MountKindBind (Path is a path the agent can see: the process
	// backend, where the agent runs on the host), MountKindVirtioFS (Tag
	// and Aname select a virtio-fs export: the VM backend), MountKindNineP
	// (the same over virtio-9p: the VM backend with COWORK_VMM_FS=9p),
	// MountKindTmpfs or MountKindSymlink (system mounts only).
	Kind  string `json:"kind"`
	Path  string `json:"path,omitempty"`
	Tag   string `json:"tag,omitempty"`
	Aname string `json:"aname,omitempty"`
	// Cache is the cache mode of the 9p device Tag selects (kind "9p"
	// only; ignored for "virtiofs", whose caching the host device decides):
	// NinePCacheNone (every read and lookup goes to the host, which
	// may change the files at any moment) or NinePCacheLoose (the guest
	// keeps file pages and metadata: for directories that do not change
	// while the guest runs, such as the read-only system directories). The
	// agent mounts each tag once, so every source of one tag names the same
	// mode.
	Cache string `json:"cache,omitempty"`
}

// Kinds of MountSource.
const (
	MountKindBind  = "bind"
	MountKindNineP = "9p"
	// MountKindVirtioFS: Tag selects the virtio-fs device (mount -t
	// virtiofs TAG), Aname the export, a directory named so in the root of
	// that device's tree. As with 9p the agent mounts each tag once, out of
	// sight, and binds exports out of it; Cache is ignored: whether the
	// guest caches a device's files is the host device's choice (it tells
	// the guest's FUSE driver with every reply).
	MountKindVirtioFS = "virtiofs"
	MountKindTmpfs    = "tmpfs"
	// MountKindSymlink makes Target a symlink to Path instead of a mount:
	// a system directory that is a symlink on the host into another one
	// (merged /usr: /bin -> usr/bin) stays one, rather than the same
	// directory being shared and mounted twice. Setup's system mounts only.
	MountKindSymlink = "symlink"
)

// DefaultPath is the PATH a spawned process starts with when the client
// gives none (and where the agent looks a command up).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// 9p cache modes of MountSource.Cache.
const (
	NinePCacheNone  = ""
	NinePCacheLoose = "loose"
)

// Mount is one mount the agent performs.
type Mount struct {
	Source   MountSource `json:"source"`
	Target   string      `json:"target"` // absolute guest path; created if missing
	ReadOnly bool        `json:"readOnly,omitempty"`
	// File marks a single-file mount (e.g. the SDK at /usr/local/bin/claude):
	// Source names the directory holding it, SourceFile the file within.
	SourceFile string `json:"sourceFile,omitempty"`
}

// SetupParams lays out the guest's root filesystem once, before any spawn.
type SetupParams struct {
	// NewRoot: build a fresh tmpfs root and pivot into it (process backend);
	// false when the agent already runs on a throwaway root (VM initramfs).
	NewRoot bool `json:"newRoot,omitempty"`
	// System are the host's system directories, read-only.
	System []Mount `json:"system"`
	// Hostname for the guest's UTS namespace; empty leaves it alone.
	Hostname string `json:"hostname,omitempty"`
	// ClockUnixNano is the helper's wall clock when it sent the setup;
	// the VM's agent steps its clock to it when off by more than a second
	// (a VM restored from a snapshot wakes at the snapshot's time). 0:
	// leave the clock alone (the process backend shares the host's).
	ClockUnixNano int64 `json:"clockUnixNano,omitempty"`
	// RootDisk, when set, is a virtio-blk disk the guest keeps its changes
	// to the root on (the VM): the agent formats it (ext4) when it holds
	// no file system, mounts it out of sight, and lays a writable overlay
	// over each system directory with its upper layer on the disk, so what
	// sessions install there survives the VM.
	RootDisk *RootDisk `json:"rootDisk,omitempty"`
	// ImageRoot, when set, makes the client's bundle image the guest's
	// userland (the VM booting the bundle): System is then empty, and the
	// agent mounts the image's root volume read-write (its writes go to
	// the profile's copy-on-write layer on the host; the image is never
	// written) and makes its top-level directories the guest's system
	// directories, then mounts the other images where the image's
	// /etc/fstab says, by label. RootDisk is not sent with it.
	ImageRoot *ImageRoot `json:"imageRoot,omitempty"`
}

// ImageRoot names the disks of the client's bundle image.
type ImageRoot struct {
	// Serial is the virtio-blk serial of the root volume's disk.
	Serial string `json:"serial"`
	// Images are the bundle's other images, each a disk of its own.
	Images []ImageDisk `json:"images,omitempty"`
}

// ImageDisk is one other image of the bundle: its disk's serial and its
// ext4 label, which the image's fstab names it by (LABEL=).
type ImageDisk struct {
	Serial string `json:"serial"`
	Label  string `json:"label"`
}

// RootDisk names the guest's writable root disk.
type RootDisk struct {
	// Serial is the disk's virtio-blk serial, by which the agent finds it
	// among the guest's disks.
	Serial string `json:"serial"`
	// PackageDB, when set, is the host's /var/lib/dpkg shared read-only:
	// the guest's /var (on the disk) gets it as the lower layer of its
	// /var/lib/dpkg, so dpkg and apt know what the shared /usr holds.
	PackageDB *MountSource `json:"packageDB,omitempty"`
}

// SetupResult is the agent's answer to setup: how long each of its steps
// took, in order, for the helper's log and the boot breakdown.
type SetupResult struct {
	Steps []TimedStep `json:"steps,omitempty"`
	// RootDisk says what became of SetupParams.RootDisk: "" when none was
	// asked for, otherwise what the agent did ("mounted", "formatted and
	// mounted") or why the root stays read-only.
	RootDisk string `json:"rootDisk,omitempty"`
	// SessionTmp: isolated spawns' /tmp is a directory of their session's
	// on the root disk (shared by the session's spawns, emptied at each
	// start), which AgentMethodPruneTmp cleans; false: each spawn's /tmp
	// is a tmpfs of its own, in guest RAM, gone with the spawn.
	SessionTmp bool `json:"sessionTmp,omitempty"`
}

// PruneTmpParams names the sessions whose /tmp on the root disk to clean:
// the entries last modified more than OlderThanSeconds ago (0: all of
// them), or with Remove the session's /tmp itself (its session deleted).
type PruneTmpParams struct {
	Sessions         []string `json:"sessions"`
	OlderThanSeconds int64    `json:"olderThanSeconds,omitempty"`
	Remove           bool     `json:"remove,omitempty"`
}

// PruneTmpResult is what AgentMethodPruneTmp removed: the bytes (apparent
// sizes), the sessions it removed something of, and per session what
// failed.
type PruneTmpResult struct {
	FreedBytes int64             `json:"freedBytes"`
	Pruned     []string          `json:"pruned"`
	Errors     map[string]string `json:"errors,omitempty"`
}

// TimedStep is one step of the agent's work and its duration.
type TimedStep struct {
	Name   string `json:"name"`
	Micros int64  `json:"us"`
}

// MountParams adds one mount (a session home, an additionalMounts entry, the SDK).
type MountParams struct {
	Mount Mount `json:"mount"`
}

// SpawnParams starts one process in the guest.
type SpawnParams struct {
	ID string `json:"id"`
	// Session is the client's spawn name: the session the process belongs
	// to, whose home is /sessions/<Session>. The helper always sets it (a
	// name it has validated); an isolated agent refuses a spawn without it.
	Session string `json:"session,omitempty"`
	// UID is the session's uid (and gid) for an isolated spawn: chosen by
	// the helper, one per session of a guest, as ValidSessionUID allows, so that
	// the file-sharing devices can show the session's files as its own
	// (see guest/agent/isolate.go). An isolated agent refuses a spawn
	// without one, or with one another session has.
	UID     uint32   `json:"uid,omitempty"`
	Command string   `json:"command"`
	Args    []string `json:"args,omitempty"`
	Cwd     string   `json:"cwd"`
	Env     []string `json:"env"` // complete environment, KEY=VALUE
	// EgressToken is the spawn's secret for the egress channel (see
	// protocol/egress.go): the agent's proxy presents it with every
	// EgressRequest of this spawn. Empty: the helper refuses the spawn's
	// egress (fails closed).
	EgressToken string `json:"egressToken,omitempty"`
	// OutputWindow, when set, holds the process's output back (flow
	// control): the agent sends its stdout and stderr only while it has
	// credit, OutputWindow bytes to start with, each event costing
	// OutputCost of its data, and more as the helper returns credit
	// (AgentMethodCredit); without credit it stops reading the pipes, so
	// the process blocks on them. An event is sent while credit is above
	// zero, so the credit in use may exceed the window by one event.
	// Between MinOutputWindow and MaxOutputWindow; 0 (an older helper):
	// output is sent as fast as it comes.
	OutputWindow int64 `json:"outputWindow,omitempty"`
}

// Session uids (SpawnParams.UID) are FirstSessionUID and the
// MaxSessionUIDs-1 after it. Far above the ids of a system's users, never 0.
const (
	FirstSessionUID = 100000
	MaxSessionUIDs  = 1 << 16
)

// ValidSessionUID says whether uid lies in the range of session uids.
func ValidSessionUID(uid uint32) bool {
	return uid >= FirstSessionUID && uid < FirstSessionUID+MaxSessionUIDs
}

// Output flow control (SpawnParams.OutputWindow, AgentMethodCredit).
const (
	MinOutputWindow = 64 << 10
	MaxOutputWindow = 16 << 20
	// OutputEventOverhead is what an output event costs beyond its
	// data, so that many small events use up the window too.
	OutputEventOverhead = 256
	// MaxOutputChunkBytes bounds the data of one output event from the
	// agent (a UTF-8 character carried over from the previous read may
	// add up to 3 bytes).
	MaxOutputChunkBytes = 64 << 10
)

// OutputCost is the credit an output event with dataBytes of data uses.
func OutputCost(dataBytes int) int64 { return int64(dataBytes) + OutputEventOverhead }

// CreditParams gives the process ID Bytes more output credit.
type CreditParams struct {
	ID    string `json:"id"`
	Bytes int64  `json:"bytes"`
}

// Validate checks the bounds of a credit request.
func (p CreditParams) Validate() error {
	if p.ID == "" {
		return errors.New("credit needs a process id")
	}
	if p.Bytes <= 0 || p.Bytes > MaxOutputWindow {
		return fmt.Errorf("credit of %d bytes: want 1 to %d", p.Bytes, MaxOutputWindow)
	}
	return nil
}

// StdinParams forwards bytes to a process's stdin (UTF-8 text, as the
// client sends it). EOF closes the stdin once Data is written.
type StdinParams struct {
	ID   string `json:"id"`
	Data string `json:"data"`
	EOF  bool   `json:"eof,omitempty"`
}

// KillParams signals a process group. Signal is a name such as "SIGTERM".
type KillParams struct {
	ID     string `json:"id"`
	Signal string `json:"signal"`
}

// ReadFileParams reads one guest file (the helper has already checked that
// Path lies inside the session).
type ReadFileParams struct {
	Path string `json:"path"`
}

// ReadFileResult carries the raw bytes (base64 in JSON).
type ReadFileResult struct {
	Content []byte `json:"content"`
}

// MaxReadFileBytes keeps a readFile reply, base64-encoded, well under MaxFrameSize.
const MaxReadFileBytes = 6 * 1024 * 1024

// UnmountParams removes the mount at Target (and any mount below it).
type UnmountParams struct {
	Target string `json:"target"`
}

// ShutdownParams ends the guest.
type ShutdownParams struct {
	GraceMillis int `json:"graceMillis"`
}

// SuspendParams ask the agent to ready its guest to be saved (stopVM on
// a host that suspends guests): every process is ended as by shutdown
// (SIGTERM, SIGKILL after GraceMillis; their exit events are sent), every
// mount but setup's is removed, the writable disks are synced and their
// journals emptied, and the page cache, dentries and inodes are dropped,
// so that what a resumed guest knows of host files is only its mount
// roots. Once it has replied the agent closes the channel and waits at
// the snapshot point (guesthost.SnapshotPointPort) to be saved; a guest
// restored from that state dials the helper again and is sent
// AgentMethodResume instead of setup.
type SuspendParams struct {
	GraceMillis int `json:"graceMillis"`
}

// ResumeParams are a resumed guest's: the wall clock to step to, and a
// seed for its random generator (every restore of one state starts with
// the same random state), MinResumeSeed to MaxResumeSeed bytes of the
// helper's randomness; another length: the agent reseeds from
// virtio-rng.
type ResumeParams struct {
	ClockUnixNano int64  `json:"clockUnixNano"`
	Seed          []byte `json:"seed,omitempty"`
}

// Bounds of ResumeParams.Seed.
const (
	MinResumeSeed = 32
	MaxResumeSeed = 512
)

// The guest-request channel: a process in the guest asks the desktop client
// something, and waits for the answer.
//
// Every spawn's environment names, in GuestRequestSocketEnv, a Unix stream
// socket the agent listens on for that spawn only (in an isolated spawn's
// own /run, which no other spawn sees). A caller connects, sends one
// GuestCall frame (4-byte BE length + JSON, at most MaxGuestCallBytes),
// and reads one Response frame ({success, result?} or {success:false,
// error}); then the connection closes. One call per connection; a caller
// that hangs up gives up its call. GuestToolPath is this binary inside the
// guest: `GuestToolPath guest-request METHOD JSON` makes one call.
//
// The agent turns a call into an EventRequest event (GuestRequest set); the
// helper publishes it to the spawn's profile as {type:"request", id, method,
// params}, with an id of its own, and answers the agent with
// guestResponse when the client's sendGuestResponse with that id arrives,
// or with an error when the call's timeout passes first.

// GuestRequestSocketEnv names the guest-request socket in a spawn's
// environment.
const GuestRequestSocketEnv = "COWORK_GUEST_REQUEST_SOCKET"

// GuestToolPath is where a spawned process finds this binary (the agent's
// own executable, bound read-only) in the guest.
const GuestToolPath = "/run/cowork/bin/cowork-vmm"

// Bounds of the guest-request channel.
const (
	// DefaultGuestRequestTimeout is how long a call waits for the client
	// when it names no timeout; MaxGuestRequestTimeout is the longest it
	// may name.
	DefaultGuestRequestTimeout = 5 * time.Minute
	MaxGuestRequestTimeout     = 30 * time.Minute
	// MinGuestRequestTimeout is the shortest: a shorter one is raised to it.
	MinGuestRequestTimeout = time.Second
	// MaxGuestRequestParamsBytes bounds a call's params (JSON text).
	MaxGuestRequestParamsBytes = 1 << 20
	// MaxGuestCallBytes bounds a GuestCall frame: the params and the rest.
	MaxGuestCallBytes = MaxGuestRequestParamsBytes + 4096
	// MaxGuestResponseBytes bounds the result the client answers with.
	MaxGuestResponseBytes = 4 << 20
	// MaxGuestRequestMethodLen bounds a call's method name.
	MaxGuestRequestMethodLen = 256
	// MaxGuestRequestsPerSession bounds the calls of one session waiting
	// for the client (the helper's count; the agent also bounds each
	// spawn's to it).
	MaxGuestRequestsPerSession = 32
)

// GuestCall is what a guest process sends on the guest-request socket.
type GuestCall struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
	// TimeoutMillis is how long to wait for the client: 0 means
	// DefaultGuestRequestTimeout; less than MinGuestRequestTimeout is
	// MinGuestRequestTimeout, more than MaxGuestRequestTimeout is
	// MaxGuestRequestTimeout.
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
}

// Timeout is the call's effective timeout.
func (c GuestCall) Timeout() time.Duration {
	return GuestRequestTimeout(c.TimeoutMillis)
}

// GuestRequestTimeout turns a TimeoutMillis into the timeout it means:
// never less than MinGuestRequestTimeout (a caller cannot make the client
// miss its requests by expiring them at once), nor more than
// MaxGuestRequestTimeout.
func GuestRequestTimeout(millis int64) time.Duration {
	if millis <= 0 {
		return DefaultGuestRequestTimeout
	}
	if millis >= MaxGuestRequestTimeout.Milliseconds() {
		return MaxGuestRequestTimeout
	}
	return max(time.Duration(millis)*time.Millisecond, MinGuestRequestTimeout)
}

// GuestCallSudo is the method of the one call the agent answers itself
// instead of the client: `sudo CMD…` in an isolated spawn (the guest tool
// under that name) asks the agent to run CMD as root of a user namespace of
// its own, in the caller's session. The call's params are SudoParams; the
// caller's standard input, output and error travel with the call's first
// bytes (SCM_RIGHTS, exactly three). After the call the caller may send
// SudoSignal frames, each a signal for the command's process group; hanging
// up kills the group. The answer's result is a SudoResult once the command
// has ended. Methods starting "cowork-vmm." never reach the client.
const GuestCallSudo = "cowork-vmm.sudo"

// GuestCallAgentPrefix starts the methods the agent keeps to itself.
const GuestCallAgentPrefix = "cowork-vmm."

// SudoParams is what `sudo` asks to run: Path the command, resolved by the
// caller in its own root (absolute), Argv its arguments with argv[0], Cwd
// the caller's working directory and Env its environment.
type SudoParams struct {
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Cwd  string   `json:"cwd"`
	Env  []string `json:"env"`
}

// SudoSignal forwards a signal the caller got to the command.
type SudoSignal struct {
	Signal int `json:"signal"`
}

// SudoResult is how the command ended: ExitCode when it exited, else
// Signal, the number of the signal that ended it.
type SudoResult struct {
	ExitCode *int `json:"exitCode,omitempty"`
	Signal   int  `json:"signal,omitempty"`
}

// GuestRequest is an EventRequest event's body on the agent channel
// (Event.GuestRequest): one GuestCall of the spawn Event.ID.
type GuestRequest struct {
	// ID is the agent's number for the call, which GuestResponseParams.ID
	// answers; unique for the agent's life.
	ID            uint64          `json:"id"`
	Method        string          `json:"method"`
	Params        json.RawMessage `json:"params,omitempty"`
	TimeoutMillis int64           `json:"timeoutMillis,omitempty"`
}

// GuestResponseParams answers the guest request ID: Error set for a
// failure, else Result (absent: null).
type GuestResponseParams struct {
	ID     uint64          `json:"id"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}
