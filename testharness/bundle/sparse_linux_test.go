package bundle

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// allocatedBytes is what path takes on disk.
func allocatedBytes(t *testing.T, path string) int64 {
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return st.Blocks * 512
}
