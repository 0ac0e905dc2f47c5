// Package egress is the helper's side of guest networking: the per-spawn
// allowedDomains policy (Policy, Registry) and the server that takes one
// connection per outbound stream from the guest proxy, checks the policy,
// resolves, filters the addresses (addrfilter.go), dials — directly or
// through the host's own proxy (UpstreamProxy) — and splices (Server).
// Subpackages: fdpass (connections
// passed as file descriptors, the process backend's transport), probe
// (networkStatus and apiReachability), splice (the shared byte pump).
//
// The path of one connection:
//
//	process ──HTTP proxy protocol──▶ guest/proxy (127.0.0.1 in the spawn's own netns)
//	        ──EgressRequest over vsock port 1025 (VM) or a passed socketpair (process backend)──▶
//	Server.HandleConn: Registry.Lookup(spawn, token) → Policy.AllowsPort(host, port) →
//	  NO_PROXY'd or no upstream proxy: resolve → address filter (never the host
//	    itself, its link or, by default, private ranges) → dial
//	  else: address filter on IP literals → CONNECT host:port via the upstream proxy
//	→ EgressReply → splice
//
// Wiring: each of the helper's profiles owns one Registry and one Server; it registers each
// spawn before asking the agent to start it (the token goes to the agent
// with the spawn) and unregisters it on exit; each guest's egress listener
// (vsock.Device.Listen(guesthost.EgressVSockPort), or fdpass.NewListener on
// the process backend's control socket) is given to Server.Serve.
package egress
