package sdkcache

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFindUsesTheEnvironmentsDirectory(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(DirEnv, dir)
	_, err := Find()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fetch-sdk.sh")

	bin := filepath.Join(dir, Version(), "claude")
	require.NoError(t, os.MkdirAll(filepath.Dir(bin), 0o755))
	require.NoError(t, os.WriteFile(bin, []byte("x"), 0o644))
	_, err = Find()
	require.Error(t, err, "not executable")

	require.NoError(t, os.Chmod(bin, 0o755))
	s, err := Find()
	require.NoError(t, err)
	assert.Equal(t, bin, s.Binary())
	assert.Regexp(t, `^\d+\.\d+\.\d+$`, s.Version)
}
