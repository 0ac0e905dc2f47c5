package protocol

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{
		"SIGTERM": syscall.SIGTERM, "sigterm": syscall.SIGTERM, "term": syscall.SIGTERM, " Kill ": syscall.SIGKILL,
		"9": syscall.SIGKILL, "SIGPWR": syscall.SIGPWR, "sys": syscall.SIGSYS, "SIGXCPU": syscall.SIGXCPU,
		"35": syscall.Signal(35), "64": syscall.Signal(64),
	} {
		got, err := ParseSignal(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "SIGNOPE", "0", "-1", "65", "99999999999999999999", "SIG", "TERM9"} {
		_, err := ParseSignal(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestSignalName(t *testing.T) {
	require.Equal(t, "SIGTERM", SignalName(syscall.SIGTERM))
	require.Equal(t, "SIGPWR", SignalName(syscall.SIGPWR))
	require.Equal(t, "SIG35", SignalName(syscall.Signal(35)))
	for _, in := range []string{"15", "term", "SIGTERM"} {
		got, err := CanonicalSignal(in)
		require.NoError(t, err)
		require.Equal(t, "SIGTERM", got)
	}
	// Every name reported round-trips.
	for n := 1; n <= 64; n++ {
		if n == 32 || n == 33 { // glibc's internal signals have no name
			continue
		}
		sig, err := ParseSignal(SignalName(syscall.Signal(n)))
		require.NoError(t, err, n)
		require.Equal(t, syscall.Signal(n), sig)
	}
}
