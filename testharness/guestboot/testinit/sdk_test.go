//go:build linux

package main

import (
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
