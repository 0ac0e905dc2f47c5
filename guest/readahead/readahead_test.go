package readahead

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Set writes the window to the entry of the file system holding fd.
func TestSetWritesTheBDIOfTheFilesFileSystem(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Open(dir)
	require.NoError(t, err)
	defer f.Close()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(int(f.Fd()), &st))
	bdis := t.TempDir()
	entry := filepath.Join(bdis, fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	require.NoError(t, os.Mkdir(entry, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(entry, "read_ahead_kb"), []byte("128\n"), 0o644))

	require.NoError(t, set(bdis, int(f.Fd()), VirtioFSKiB))
	got, err := os.ReadFile(filepath.Join(entry, "read_ahead_kb"))
	require.NoError(t, err)
	require.Equal(t, "1024", string(got))
}

// A file system without an entry (no sysfs, or no BDI) is an error that
// names the device, not a silent success.
func TestSetWithoutAnEntryFails(t *testing.T) {
	f, err := os.Open(t.TempDir())
	require.NoError(t, err)
	defer f.Close()
	err = set(t.TempDir(), int(f.Fd()), VirtioFSKiB)
	require.ErrorContains(t, err, "read-ahead of")
}
