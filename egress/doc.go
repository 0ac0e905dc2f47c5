// Package egress is the helper's side of guest networking: the per-spawn
// allowedDomains policy (Policy, Registry) and the server that takes one
// connection per outbound stream from the guest proxy, checks the policy,
// resolves, dials and splices (Server). Subpackages: fdpass (connections
// passed as file descriptors, the process backend's transport), probe
// (networkStatus and apiReachability), splice (the shared byte pump).
package egress
