package vm

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// TestOpenRootDiskInUse: a root disk another VM holds (helper.OpenRootDisk
// locks it) is not attached: the guest starts without it, with a warning
// naming the file, rather than failing; once free it is opened.
func TestOpenRootDiskInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "root.img")
	require.NoError(t, os.WriteFile(path, make([]byte, 1<<20), 0o600))
	held, err := helper.OpenRootDisk(path)
	require.NoError(t, err)
	var logged bytes.Buffer
	b := &Backend{log: slog.New(slog.NewTextHandler(&logged, nil))}

	assert.Nil(t, b.openRootDisk(path))
	assert.Contains(t, logged.String(), "without a root disk")
	assert.Contains(t, logged.String(), path)
	require.NoError(t, held.Close())
	f := b.openRootDisk(path)
	require.NotNil(t, f)
	require.NoError(t, f.Close())
	assert.Nil(t, b.openRootDisk(""), "none asked for")
}

// TestAdjustSetupNamesTheRootDisk: with a root disk attached the agent is
// told its serial; without, nothing.
func TestAdjustSetupNamesTheRootDisk(t *testing.T) {
	g := newGuestState(newConsole(nil, nil), nil, protocol.MountKindVirtioFS)
	var p protocol.SetupParams
	g.AdjustSetup(&p)
	assert.Nil(t, p.RootDisk)
	g.disk = &rootDisk{}
	g.AdjustSetup(&p)
	require.NotNil(t, p.RootDisk)
	assert.Equal(t, "cowork-root", p.RootDisk.Serial)
}
