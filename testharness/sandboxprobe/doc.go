// Package sandboxprobe is what the sandbox tests (guest/agent,
// helper/backend/process) run as a spawned process to see what it can
// reach: the test binary, re-executed, calls Run, which tries the escapes
// issue #39 found — open the controlling terminal, push input into a
// terminal with TIOCSTI, read and add to the session keyring — and prints
// one "name: result" line each, which the test reads back with Parse.
package sandboxprobe
