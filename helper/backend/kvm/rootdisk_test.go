package kvm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// TestRootDiskIsLockedWhileOpen: a second VM cannot open a root disk in
// use; once the first lets go, it can. A symlink is not followed.
func TestRootDiskIsLockedWhileOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "root.img")
	require.NoError(t, os.WriteFile(path, make([]byte, 1<<20), 0o600))
	first, err := openRootDisk(path)
	require.NoError(t, err)
	_, err = openRootDisk(path)
	assert.ErrorContains(t, err, "in use by another VM")
	require.NoError(t, first.Close())
	again, err := openRootDisk(path)
	require.NoError(t, err)
	require.NoError(t, again.Close())

	link := filepath.Join(t.TempDir(), "link.img")
	require.NoError(t, os.Symlink(path, link))
	_, err = openRootDisk(link)
	assert.Error(t, err, "a symlinked root disk is refused")
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
