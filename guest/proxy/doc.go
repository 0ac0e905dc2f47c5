// Package proxy is the guest side of egress: an HTTP proxy on loopback, one
// per spawn, that carries each CONNECT tunnel or plain http:// request to
// the helper over a HostDialer (vsock in the VM, passed socketpairs in the
// process backend) with a protocol.EgressRequest naming the spawn. The
// helper decides; the proxy turns its answer into HTTP (403 with
// X-Cowork-Egress: blocked-by-allowlist or blocked-by-address-filter for a
// refusal, 502 for failures) and splices.
// Subpackage netns gives each spawn a network namespace with only loopback,
// so the proxy is its only way out. The spawn's egress token (Config.Token)
// stays in the proxy, in the agent: the listener a connection arrives on —
// in that spawn's namespace only — says whose it is, so the token never
// enters the spawn's environment or files.
package proxy
