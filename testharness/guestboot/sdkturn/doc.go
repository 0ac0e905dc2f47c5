// Package sdkturn times turns of the real Claude Code CLI (the build
// package sdkcache finds) against a fake Messages API (package fakeapi)
// served on the machine's own loopback: spawn → first stdout byte and
// spawn → exit for `claude -p PROMPT` with stdin closed, and for one
// stream-json turn (the first byte of its result line; the exit after
// stdin closes). Every machine gets the same loopback API, so the figures
// compare starting and running the CLI, its binary read over whatever
// file system holds it, and not an egress path.
//
// It is also the contract of testinit's SDK mode (package guestboot's
// test guest): the kernel command line words that switch the mode on and
// say what to mount and run (Config), the turns a boot runs (Turns), and
// the console lines they are reported with (fsbench.Result's format under
// Marker). The bench (package bench) runs the same Boot natively, beside
// the guests, so every system runs the same code.
package sdkturn
