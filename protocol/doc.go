// Package protocol owns every byte that crosses a socket: the frame codec
// (4-byte big-endian length + UTF-8 JSON, 10 MiB cap), the typed messages of
// the desktop client ↔ helper contract (methods, replies, events), the typed
// messages of the helper ↔ guest-agent channel, and the Unix-socket server
// with its three connection modes and peer checks.
//
// It knows nothing of VMs or processes.
//
// Files:
//   - frame.go: ReadFrame / WriteFrame / WriteJSON.
//   - messages.go: Request / Response, DecodeRequest, method names, every
//     method's params and result type, DecodeParams, the lenient Int.
//   - event.go: Event (client events; also sent by the agent).
//   - server.go, serverconn.go: Server and the Handler it calls; the
//     connection modes (one-shot, pipe, subscription); the bounds on
//     connections that have sent no request yet (a first-request deadline,
//     a per-uid cap).
//   - connstate.go: ConnState, what a Handler keeps for one connection
//     between its calls (the pipe's configured profile).
//   - listen.go: Listen (socket-path and directory safety) and peer uid
//     checks.
//   - agent.go: the helper ↔ agent channel's frames and messages; its
//     client and server are agentrpc/.
//   - egress.go: the egress channel's request/reply frames (guest proxy ↔
//     helper), added by the egress work.
//   - guesthost/: the constants both sides of the guest ↔ host contract
//     share (vsock and I/O ports, magic bytes, refusal words), in a leaf
//     package that devices/ and the guest import without this one.
//   - client.go: a small client (CallOneShot, DialPipe, SubscribeEvents)
//     speaking the contract as the desktop client does, for tests and tools.
//
// Unknown methods: the Server answers any name not in Methods with
// "Unknown method: <name>" itself, without calling the Handler; a Handler
// may also return an error wrapping ErrUnknownMethod for a listed method it
// does not implement, with the same reply.
package protocol
