//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/sdkturn"
)

func TestSDKModeOffAndBadConfig(t *testing.T) {
	var out strings.Builder
	require.False(t, sdkMode("console=ttyS0 guestboot.fs=seq", &out))
	require.Empty(t, out.String())

	// A bad configuration fails every turn with the reason, and the guest
	// still prints the end marker the host waits for.
	require.True(t, sdkMode("console=ttyS0 "+sdkturn.KeyBinary+"=../claude", &out))
	got, err := sdkturn.Results(out.String())
	require.NoError(t, err)
	require.Len(t, got, len(sdkturn.Turns))
	for i, r := range got {
		require.Equal(t, sdkturn.Turns[i].ID, r.Workload)
		require.Contains(t, r.Err, "binary path")
	}
}

func TestExistsInRootFollowsAbsoluteSymlinksInside(t *testing.T) {
	root := t.TempDir()
	// A merged-/usr root: /lib64 -> usr/lib64, whose loader is an
	// absolute symlink (into a directory this machine has not).
	for _, d := range []string{"usr/lib64", "cowork-test-lib"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	require.NoError(t, os.Symlink("usr/lib64", filepath.Join(root, "lib64")))
	require.NoError(t, os.WriteFile(filepath.Join(root, "cowork-test-lib/ld.so"), nil, 0o755))
	require.NoError(t, os.Symlink("/cowork-test-lib/ld.so", filepath.Join(root, "usr/lib64/ld.so")))

	require.NoError(t, existsInRoot(root, "/lib64/ld.so"))
	_, err := os.Stat(filepath.Join(root, "/lib64/ld.so"))
	require.Error(t, err, "from outside the root the absolute symlink misses")
	require.ErrorContains(t, existsInRoot(root, "/usr/bin/missing"), "/usr/bin/missing in "+root)
}
