// Package helper is the helper's state machine: it implements every method of
// the desktop client's contract (docs/PROTOCOL.md) on top of a Backend that
// starts a guest and hands back one connection to the guest agent.
//
// It knows nothing of sockets (package protocol serves the client) nor of how
// a guest is made (the backends: helper/backend/kvm and
// helper/backend/process). Its files, by what they hold:
//
//   - service.go: Options, the Service, method dispatch, configure and the
//     small methods; backend.go: the Backend and Guest interfaces.
//   - lifecycle.go: one guest's life — startVM, the agent connection and its
//     pings, stopVM, guest death — and turning agent events into client
//     events; agentclient.go: the agent channel's request/reply client.
//   - hub.go: the event hub with its per-profile backlog.
//   - sessions.go: session names and their host directories; mounts.go: what
//     is shared with the guest and mounted where (session homes, mountPath,
//     the SDK), and withdrawing it; spawn.go: spawn and its environment;
//     processes.go: the process table, kill, writeStdin, isProcessRunning;
//     readfile.go: readFile; sdk.go: installSdk.
//   - janitor.go: disk info, deleteSessionDirs, pruneSessionCaches (by
//     descriptor: session directories are guest-writable).
//   - network.go: egress (one egress.Server and Registry serving every
//     guest's egress listener) and the networkStatus and apiReachability
//     monitors.
package helper
