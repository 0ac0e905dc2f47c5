package nested

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHostTSCkHz: on amd64 the host's TSC rate is measured (two
// measurements agree within 2 %), and the outer kernel is told it.
func TestHostTSCkHz(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		require.Equal(t, int64(defaultTSCkHz), hostTSCkHz(time.Millisecond))
		t.Skip("the TSC is measured on amd64 only")
	}
	a, b := hostTSCkHz(50*time.Millisecond), hostTSCkHz(50*time.Millisecond)
	t.Logf("host TSC: %d kHz, %d kHz", a, b)
	require.InDelta(t, float64(a), float64(b), 0.02*float64(a), "two measurements of the same TSC")
	args := strings.Join(qemuArgs(Options{tscKHz: a}, "/p", "/i"), " ")
	require.Contains(t, args, " tsc_early_khz="+itoa(a)+" ")
	require.Contains(t, strings.Join(qemuArgs(Options{}, "/p", "/i"), " "), " tsc_early_khz=2000000 ", "unmeasured: the default")
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
