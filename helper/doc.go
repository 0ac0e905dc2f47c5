// Package helper is the helper's state machine: it implements every method of
// the desktop client's contract (docs/PROTOCOL.md) on top of a Backend that
// starts a guest and hands back one connection to the guest agent.
//
// It knows nothing of sockets (package protocol serves the client) nor of how
// a guest is made (the backends: helper/backend/vm and
// helper/backend/process). The Helper keeps one Service per client profile
// (userDataName + userDataRoot) and hands each call to the Service of its
// profile; a Service holds everything of one profile: its guest, processes,
// sessions, quota, SDK, token and events. Its files, by what they hold:
//
//   - helper.go: the Helper — profiles and the routing of calls to them (the
//     connection's configured profile, else the last configured), Close.
//   - service.go: Options, the Service, method dispatch, configure, createVM
//     and the small methods; backend.go: the Backend and Guest interfaces,
//     and the optional ones for what only some backends do (SystemSharer,
//     SetupAdjuster, RootDiskAttacher, Restorable, Suspender,
//     ProgressReporter): the helper never tests a backend's name.
//   - state.go: the data directory's layout and state files (what a
//     restarted helper reloads), saved atomically.
//   - lifecycle.go: one guest's life — startVM, the agent connection and its
//     pings, stopVM, guest death — and turning agent events into client
//     events (the channel's client is protocol/agentrpc's);
//     suspend.go: stopVM suspending a guest that can be (Suspender), and
//     a resumed guest's setup;
//     liveness.go: telling a busy guest from a dead one when its pings
//     time out (the agent's last frame, ProgressReporter).
//   - hub.go: a profile's event hub with its backlog.
//   - flow.go: output flow control (the agent's credit) and the bounds
//     that keep a hub's memory within its cap.
//   - sessions.go: session names and their host directories;
//     sessionmounts.go: the one owner of what is shared with the guest and
//     mounted where (session homes, mountPath, the SDK), its states
//     (mounted, withdrawn, forgotten) and the sessions' uses; mounts.go:
//     the client's mount requests checked on the host side, and mountPath;
//     spawn.go: spawn, its environment and its flags (isResume, oneShot,
//     mountSkeletonHome); skeleton.go: the home skeleton's copy;
//     processes.go: the process table, kill, writeStdin, isProcessRunning;
//     readfile.go: readFile (in the guest, or from the host while it is
//     down); sdk.go: installSdk; sessionuid.go: each session's uid in the
//     guest, which its spawns run as and its shares show as the owner.
//   - memwatch.go: the host's memory, and idle guests asked for memory
//     back when it runs short (MemoryReclaimer).
//   - janitor.go: disk info against the quota, deleteSessionDirs,
//     pruneSessionCaches (by descriptor: session directories are
//     guest-writable); disksize.go: the sessions' cached sizes and their
//     background measures.
//   - guestrequest.go: guest requests (the agent's request events, the
//     client's sendGuestResponse, their timeouts and bounds) and the exits'
//     oomKillCount.
//   - network.go: egress (a profile's egress.Server and Registry serving its
//     guest's egress listener) and the networkStatus and apiReachability
//     monitors.
package helper
