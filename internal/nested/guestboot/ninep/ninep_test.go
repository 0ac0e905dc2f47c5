package ninep

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCmdlineRoundTrip(t *testing.T) {
	c := Config{Tag: "bench", Aname: "dir", MiB: 16}
	got, ok, err := ParseCmdline("console=ttyS0 quiet " + c.Cmdline() + " reboot=t")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, c, got)

	got, ok, err = ParseCmdline(KeyTag + "=t")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Config{Tag: "t", MiB: DefaultMiB}, got)
}

func TestParseCmdlineModeOffAndBadValues(t *testing.T) {
	_, ok, err := ParseCmdline("console=ttyS0 " + KeyMiB + "=8")
	require.NoError(t, err)
	require.False(t, ok, "no tag: the mode is off")

	for _, cmdline := range []string{
		KeyTag + "=t " + KeyMiB + "=lots",
		KeyTag + "=t " + KeyMiB + "=0",
		KeyTag + "=t " + KeyMiB + "=99999",
		KeyTag + "=",
		KeyTag + "=a,b",
		KeyTag + "=t " + KeyAname + "=x,cache=loose",
	} {
		_, ok, err := ParseCmdline(cmdline)
		require.True(t, ok, cmdline)
		require.Error(t, err, cmdline)
	}
}

func TestResultLineRoundTrip(t *testing.T) {
	r := Result{Bytes: 64 << 20, Write: 1500 * time.Millisecond, Read: 750 * time.Millisecond, Msize: 262144}
	got, ok, err := ParseLine("[   3.1] " + r.Line())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, r, got)
	require.InDelta(t, 44.74, got.WriteMBps(), 0.01)
	require.InDelta(t, 89.48, got.ReadMBps(), 0.01)

	e := Result{Err: `mount "x": no such device`}
	got, ok, err = ParseLine(e.Line())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, e, got)
}

func TestParseLineRejectsMalformed(t *testing.T) {
	_, ok, err := ParseLine("TESTINIT OK cpus=0")
	require.NoError(t, err)
	require.False(t, ok)
	for _, line := range []string{
		Marker + " bytes=1 write_ns=2 read_ns=3",              // msize missing
		Marker + " bytes=1 write_ns=2 read_ns=3 read_ns=4",    // duplicate, msize missing
		Marker + " bytes=1 write_ns=-2 read_ns=3 msize=4",     // negative
		Marker + " bytes=1 write_ns=2 read_ns=3 msize",        // not key=value
		Marker + ` error="unterminated`,                       // bad quoting
		Marker + " bytes=x write_ns=2 read_ns=3 msize=262144", // not a number
	} {
		_, ok, err := ParseLine(line)
		require.True(t, ok, line)
		require.Error(t, err, line)
	}
	require.Zero(t, Result{Bytes: 1}.WriteMBps(), "no time: no throughput rather than +Inf")
}

func TestStampsDifferBetweenBlocks(t *testing.T) {
	a, b := make([]byte, 64), make([]byte, 64)
	FillPattern(a)
	FillPattern(b)
	require.Equal(t, a, b)
	StampBlock(a, 1)
	StampBlock(b, 2)
	require.NotEqual(t, a, b)
	require.Equal(t, uint64(2), BlockStamp(b))
	require.NotEqual(t, a[8:16], a[16:24], "neighbouring chunks differ")
}
