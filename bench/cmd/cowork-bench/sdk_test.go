package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/bench"
	"github.com/cowork-vmm/cowork-vmm/testharness/sdkcache"
)

func TestSDKInHarness(t *testing.T) {
	dir := t.TempDir() // under /tmp, which the outer guest replaces
	t.Setenv(sdkcache.DirEnv, dir)
	opts := bench.Options{SDKRuns: 2, SDKMemMiB: 768}
	args, shares, extra := sdkInHarness(opts)
	assert.Equal(t, []string{"--sdk-runs", "2", "--sdk-mem", "768"}, args, "no CLI here: the bench inside says so")
	assert.Empty(t, shares)
	assert.Zero(t, extra)

	bin := filepath.Join(dir, sdkcache.Version(), "claude")
	require.NoError(t, os.MkdirAll(filepath.Dir(bin), 0o755))
	require.NoError(t, os.WriteFile(bin, make([]byte, 3<<20), 0o755))
	args, shares, extra = sdkInHarness(opts)
	assert.Equal(t, []string{"--sdk-runs", "2", "--sdk-mem", "768", "--sdk-dir", dir}, args)
	assert.Equal(t, []string{dir}, shares, "the harness shares the CLI's directory")
	assert.Equal(t, 768+3+nativeCLIMiB, extra)

	opts.Benches = "boot"
	args, shares, extra = sdkInHarness(opts)
	assert.Equal(t, []string{"--sdk-runs", "2"}, args)
	assert.Empty(t, shares)
	assert.Zero(t, extra)
}
