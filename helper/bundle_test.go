package helper

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

// TestStartVMSaysTheBundleIsNotBooted: the client's bundlePath is logged
// once (per path) as not booted, with what its rootfs image is.
func TestStartVMSaysTheBundleIsNotBooted(t *testing.T) {
	var logs ratelogtest.LogBuffer
	e := newTestEnvWith(t, func(o *Options) { o.Logger = logs.Logger() })
	bundle := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bundle, "rootfs.img"), make([]byte, 4096), 0o644))
	for range 2 {
		e.mustCall("startVM", map[string]any{"bundlePath": bundle}, nil)
		e.mustCall("stopVM", nil, nil)
	}
	lines := logs.Lines("VM bundle is not booted")
	require.Len(t, lines, 1, "logged once for the same bundle")
	assert.Contains(t, lines[0], bundle)
	assert.Contains(t, lines[0], "rootfs.img, 4096 bytes, not read")
	e.mustCall("startVM", map[string]any{"bundlePath": filepath.Join(bundle, "other")}, nil)
	lines = logs.Lines("VM bundle is not booted")
	require.Len(t, lines, 2, "a new bundle path is logged again")
	assert.Contains(t, lines[1], "no rootfs.img")
}
