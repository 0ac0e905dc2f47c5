package bench

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parseFlags parses args as cowork-bench does: AddFlags, then Validate.
func parseFlags(args ...string) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	return o, o.Validate()
}

func TestFlagsValidate(t *testing.T) {
	o, err := parseFlags()
	require.NoError(t, err)
	assert.Equal(t, DefaultRuns, o.Runs)
	assert.Equal(t, DefaultBinary, o.Binary)
	assert.Equal(t, "auto", o.Backend)

	_, err = parseFlags("--runs", "0")
	assert.ErrorContains(t, err, "--runs 0")
	_, err = parseFlags("--backend", "xen")
	assert.ErrorContains(t, err, `--backend "xen"`)
	_, err = parseFlags("--peers", "firecracker")
	assert.ErrorContains(t, err, `unknown peer "firecracker"`)
	_, err = parseFlags("--mem", "32")
	assert.ErrorContains(t, err, "--mem 32")
}

func TestRunNeedsABinary(t *testing.T) {
	_, err := Run(t.Context(), Options{Binary: "/nonexistent/cowork-vmm", Out: t.TempDir()}, io.Discard)
	assert.ErrorContains(t, err, "not a file")
	_, err = Run(t.Context(), Options{Out: t.TempDir()}, io.Discard)
	assert.ErrorContains(t, err, "no --binary")
}

func TestSDKFlags(t *testing.T) {
	o, err := parseFlags()
	require.NoError(t, err)
	assert.Equal(t, DefaultSDKRuns, o.SDKRuns)
	assert.Equal(t, DefaultSDKMemMiB, o.SDKMemMiB)
	assert.True(t, BootSelected(o))
	assert.True(t, SDKSelected(o))

	o, err = parseFlags("--benches", "sdk", "--sdk-runs", "1", "--sdk-dir", "/x")
	require.NoError(t, err)
	assert.False(t, BootSelected(o))
	assert.True(t, SDKSelected(o))
	assert.Equal(t, "/x", o.SDKDir)
	o, err = parseFlags("--benches", "boot, fs")
	require.NoError(t, err)
	assert.False(t, SDKSelected(o))
	o, err = parseFlags("--sdk-runs", "0")
	require.NoError(t, err)
	assert.False(t, SDKSelected(o))

	_, err = parseFlags("--benches", "sdk,net")
	assert.ErrorContains(t, err, `unknown bench "net"`)
	_, err = parseFlags("--sdk-runs", "-1")
	assert.ErrorContains(t, err, "--sdk-runs -1")
	_, err = parseFlags("--sdk-mem", "128")
	assert.ErrorContains(t, err, "--sdk-mem 128")
}
