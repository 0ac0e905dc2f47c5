package process

import (
	"fmt"
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

// TestSDKMountWhereTheHostLacksItsDirectory: a host whose /usr has no
// local directory (NixOS's /usr holds bin/env only) gets the SDK at
// /usr/local/bin/claude too. The agent covers /usr with a writable copy
// of itself to make the directories; everything /usr held must stay
// reachable through the copy, in the agent's namespace and in spawns'.
// Here the missing directory is one of the host's /usr's own choosing.
func TestSDKMountWhereTheHostLacksItsDirectory(t *testing.T) {
	_, err := os.Stat("/usr/cowork-test-missing")
	require.ErrorIs(t, err, os.ErrNotExist)
	hostBin, err := os.ReadDir("/usr/bin")
	require.NoError(t, err)
	g, c := startSandbox(t)
	sdk := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(sdk, "claude"), []byte("#!/bin/sh\necho sdk \"$@\"\n"), 0o755))
	src, err := g.Share(filepath.Join(sdk, "claude"), true)
	require.NoError(t, err)
	require.NoError(t, c.call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{
		Source: src, SourceFile: "claude", Target: "/usr/cowork-test-missing/bin/claude", ReadOnly: true}}))

	r := c.run("after", `/usr/cowork-test-missing/bin/claude --version
		ls -A /usr/bin | wc -l
		echo x > /usr/bin/cowork-test 2>/dev/null && echo USR-BIN-WRITABLE
		echo x > /usr/cowork-test-missing/bin/claude 2>/dev/null && echo SDK-WRITABLE
		true`)
	require.Equal(t, 0, *r.Exit.ExitCode, r.Stderr.String())
	assert.Equal(t, fmt.Sprintf("sdk --version\n%d\n", len(hostBin)), r.Stdout.String(), r.Stderr.String())
}
