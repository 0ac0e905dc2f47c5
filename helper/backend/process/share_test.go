package process

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// A file is shared as its directory, from which the agent binds only the
// file (Mount.SourceFile); Unshare has nothing to withdraw.
func TestShareOfAFileNamesItsDirectory(t *testing.T) {
	var g guest
	dir := t.TempDir()
	file := filepath.Join(dir, "claude")
	require.NoError(t, os.WriteFile(file, []byte("#!/bin/sh\n"), 0o755))
	src, err := g.Share(file, true)
	require.NoError(t, err)
	assert.Equal(t, protocol.MountSource{Kind: "bind", Path: dir}, src)
	src, err = g.Share(dir, false)
	require.NoError(t, err)
	assert.Equal(t, protocol.MountSource{Kind: "bind", Path: dir}, src)
	g.Unshare(src)
}
