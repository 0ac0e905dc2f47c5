//go:build linux

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot/ninep"
)

func TestMeasureWritesAndChecksTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), ninep.FileName)
	res, err := measure(path, 3)
	require.NoError(t, err)
	require.Equal(t, int64(3*ninep.BlockSize), res.Bytes)
	require.Positive(t, res.Write)
	require.Positive(t, res.Read)

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Len(t, data, 3*ninep.BlockSize)
	want := make([]byte, ninep.BlockSize)
	ninep.FillPattern(want)
	ninep.StampBlock(want, 2)
	require.Equal(t, want, data[2*ninep.BlockSize:], "the last block is stamped with its number")
}

func TestMeasureFailsWhereItCannotWrite(t *testing.T) {
	_, err := measure(filepath.Join(t.TempDir(), "missing", ninep.FileName), 1)
	require.Error(t, err)
}

func TestNinePModeOffAndBadConfig(t *testing.T) {
	_, on := ninePMode("console=ttyS0 quiet")
	require.False(t, on)

	line, on := ninePMode("console=ttyS0 " + ninep.KeyTag + "=bench " + ninep.KeyMiB + "=0")
	require.True(t, on)
	res, ok, err := ninep.ParseLine(line)
	require.True(t, ok)
	require.NoError(t, err)
	require.Contains(t, res.Err, "0 MiB")
}
