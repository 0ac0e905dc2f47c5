// Package helper is the helper's state machine: it implements every method of
// the desktop client's contract (PROTOCOL.md) on top of a Backend that starts
// a guest and hands back one connection to the guest agent.
//
// It owns configure/profile state, the VM lifecycle (startVM, stopVM, guest
// death), the events hub with its per-profile backlog, sessions as host
// directories under the data directory (spawn, mounts, readFile, disk info,
// delete, prune), SDK installation and OAuth token injection, and egress:
// one egress.Server and Registry (each spawn's allowedDomains and token)
// serving every guest's EgressGuest listener, plus the networkStatus and
// apiReachability monitors (network.go). It knows
// nothing of sockets (package protocol serves the client) nor of how a guest
// is made (the backends: helper/process, and the VM backend later).
package helper
