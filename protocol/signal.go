package protocol

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Signals on the wire are Linux names ("SIGTERM"), as kill's signal and an
// exit event's signal. ParseSignal is the one definition of which ones are
// accepted; SignalName of how one is reported.

// ParseSignal turns what a client may send as a signal into the signal:
// a name in any case, with or without "SIG" ("SIGTERM", "term"), or a
// number ("15", "SIG35"). Every signal Linux has is accepted (32 and 33,
// which the C library keeps for itself, are not); "" is an error.
func ParseSignal(s string) (syscall.Signal, error) {
	name := strings.ToUpper(strings.TrimSpace(s))
	if name == "" {
		return 0, fmt.Errorf("no signal given (use a name such as SIGTERM, or a number)")
	}
	if n, err := strconv.Atoi(strings.TrimPrefix(name, "SIG")); err == nil { // "15", or "SIG35" as SignalName reports it
		if n <= 0 || n > maxSignal || unix.SignalName(syscall.Signal(n)) == "" && n < sigRTMin {
			return 0, fmt.Errorf("signal %d is not a Linux signal (1–%d)", n, maxSignal)
		}
		return syscall.Signal(n), nil
	}
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, fmt.Errorf("unknown signal %q (use a name such as SIGTERM, SIGKILL, SIGINT, SIGHUP, or a number)", s)
}

// Linux's real-time signals have numbers, not names.
const (
	sigRTMin  = 34
	maxSignal = 64
)

// SignalName is the name a signal is reported by ("SIGTERM"); a signal
// without a name (a real-time one) is "SIG<number>", e.g. "SIG35".
func SignalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return "SIG" + strconv.Itoa(int(sig))
}

// CanonicalSignal is SignalName(ParseSignal(s)): a signal as it is passed
// on and reported, or the reason s is not one.
func CanonicalSignal(s string) (string, error) {
	sig, err := ParseSignal(s)
	if err != nil {
		return "", err
	}
	return SignalName(sig), nil
}
