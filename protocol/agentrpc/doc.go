// Package agentrpc owns the helper ↔ guest-agent channel's conversation
// (the frames and messages are protocol/agent.go's): the one client, which
// the helper and every test that plays the helper use, and the one server,
// which the agent and every test that plays the agent use.
//
// Files:
//   - client.go: Client — Dial reads and checks the agent's hello, a read
//     loop matches replies to calls by id and hands events to a callback in
//     order; Call (or Begin then Wait) with its write bounded by its
//     context (a frame cut short mid-write is finished in the background so
//     the stream stays whole); LastReceived for the helper's liveness.
//   - server.go: Server — SendHello, Emit, and Serve, which dispatches
//     requests to typed Handlers (Handle, HandleNoResult) concurrently, up
//     to a bound, and writes every reply and event through one serialized
//     writer; a Final method (shutdown) is served inline and ends Serve.
//   - agenttest/: the helper side for tests that drive an agent — a Client
//     that gathers each process's output, guest requests and exit and waits
//     for them (the agent's, the process backend's and the VM backend's
//     tests).
//
// Every frame from the peer is validated: a bad hello ends Dial, undecodable
// frames end the client's connection, a frame that is not a request gets
// the server an error reply, never a panic.
package agentrpc
