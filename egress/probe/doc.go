// Package probe produces the networkStatus and apiReachability events: the
// guest has no network of its own, so the helper's view of the network (its
// routes, its resolver, and a HEAD of startVM.apiProbeURL through the egress
// dialer) is the guest's.
package probe
