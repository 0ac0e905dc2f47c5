package agent

import (
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// parseSignal turns a signal name ("SIGTERM", or "TERM") into the signal.
func parseSignal(name string) (syscall.Signal, error) {
	n := strings.ToUpper(strings.TrimSpace(name))
	if n == "" {
		return 0, fmt.Errorf("no signal name given (use e.g. SIGTERM)")
	}
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	sig := unix.SignalNum(n)
	if sig == 0 {
		return 0, fmt.Errorf("unknown signal %q (use a name such as SIGTERM, SIGKILL, SIGINT, SIGHUP)", name)
	}
	return sig, nil
}

// signalName is the name the exit event reports, e.g. "SIGTERM".
func signalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return fmt.Sprintf("SIG%d", int(sig))
}
