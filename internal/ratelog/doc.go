// Package ratelog writes log lines about events that a peer or a guest can
// cause at a bounded rate, so that a flood of such events cannot flood the
// host's log.
//
// A Limiter allows a burst of events per interval and counts the ones it
// refuses; a Logger is a *slog.Logger whose lines pass through a Limiter and
// carry, on the first line let through after a refusal, how many lines were
// suppressed ("suppressed"=N). Both are safe for concurrent use.
//
// This is the helper's one definition of a rate-limited logger (issue #20):
// the virtio devices (mmio, rng, vsock, p9), vmm's buses, egress and
// acceptloop log what a guest or a peer can cause through it.
package ratelog
