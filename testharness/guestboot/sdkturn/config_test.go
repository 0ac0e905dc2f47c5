package sdkturn

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

func TestCmdlineRoundTrip(t *testing.T) {
	c := Config{Binary: "2.1.337/claude",
		Data: fsbench.Mount{Type: fsbench.TypeVirtioFS, Tag: "fsdata", Sub: "bench"},
		Root: fsbench.Mount{Type: fsbench.TypeNineP, Tag: "fsroot", Cache: "loose"}}
	require.NoError(t, c.Validate())
	got, ok, err := ParseCmdline("console=ttyS0 quiet " + c.Cmdline())
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, c, got)

	_, ok, err = ParseCmdline("console=ttyS0 guestboot.fs=seq")
	require.False(t, ok, "the mode is off without its word")
	require.NoError(t, err)

	for _, bad := range []string{
		"guestboot.sdk=/abs/claude " + c.Cmdline()[len("guestboot.sdk=2.1.337/claude"):],
		"guestboot.sdk=../claude guestboot.sdkdata=" + c.Data.Word() + " guestboot.sdkroot=" + c.Root.Word(),
		"guestboot.sdk=a/../b guestboot.sdkdata=" + c.Data.Word() + " guestboot.sdkroot=" + c.Root.Word(),
		"guestboot.sdk=a,b guestboot.sdkdata=" + c.Data.Word() + " guestboot.sdkroot=" + c.Root.Word(),
		"guestboot.sdk= guestboot.sdkdata=" + c.Data.Word() + " guestboot.sdkroot=" + c.Root.Word(),
		"guestboot.sdk=claude guestboot.sdkdata=" + c.Data.Word(),
		"guestboot.sdk=claude guestboot.sdkdata=blk:vda:::: guestboot.sdkroot=" + c.Root.Word(),
		"guestboot.sdk=claude guestboot.sdkdata=nfs:x:::: guestboot.sdkroot=" + c.Root.Word(),
	} {
		_, ok, err := ParseCmdline(bad)
		require.True(t, ok, bad)
		require.Error(t, err, bad)
	}
}

func TestResultsFromConsole(t *testing.T) {
	cold := fsbench.Result{Workload: "print_cold", Values: map[string]int64{KeyFirstByte: 5, KeyExit: 9}}
	failed := fsbench.Result{Workload: "stream_cold", Err: "the CLI failed: exit status 1"}
	got, err := Results("[ 1.0] boot\r\nTESTINIT OK\r\n" + Line(cold) + "\r\n" + Line(failed) + "\r\n" + EndMarker + "\r\nTESTINIT DONE\r\n")
	require.NoError(t, err)
	require.Equal(t, []fsbench.Result{cold, failed}, got)

	_, err = Results(Line(cold) + "\nTESTINIT DONE\n")
	require.ErrorContains(t, err, "did not finish")
	_, err = Results(Marker + " workload=print_cold first_byte_ns=x\n" + EndMarker + "\n")
	require.Error(t, err)
	// The fs mode's lines are not the SDK mode's.
	got, err = Results(fsbench.Result{Workload: "seq", Values: map[string]int64{"bytes": 1}}.Line() + "\n" + EndMarker + "\n")
	require.NoError(t, err)
	require.Empty(t, got)
}
