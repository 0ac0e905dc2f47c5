// Package protocol owns every byte that crosses a socket: the frame codec
// (4-byte big-endian length + UTF-8 JSON, 10 MiB cap), the typed messages of
// the desktop client ↔ helper contract (methods, replies, events), the typed
// messages of the helper ↔ guest-agent channel, and the Unix-socket server
// with its three connection modes and peer checks.
//
// It knows nothing of VMs or processes.
package protocol
