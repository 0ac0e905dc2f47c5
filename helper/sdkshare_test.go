package helper

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// writeSDK writes root/<version>/claude with content, in place (the same
// inode, truncated) when it exists.
func writeSDK(t *testing.T, root, version, content string) string {
	t.Helper()
	file := filepath.Join(root, version, "claude")
	require.NoError(t, os.MkdirAll(filepath.Dir(file), 0o755))
	require.NoError(t, os.WriteFile(file, []byte(content), 0o755))
	return file
}

// replaceSDK puts a new file at root/<version>/claude as a download does:
// written beside it, renamed over it.
func replaceSDK(t *testing.T, root, version, content string) {
	t.Helper()
	file := filepath.Join(root, version, "claude")
	require.NoError(t, os.WriteFile(file+".download", []byte(content), 0o755))
	require.NoError(t, os.Rename(file+".download", file))
}

// sdkShares returns the host paths under root the guest got through
// Share and through ShareSystem, and what Unshare withdrew.
func sdkShares(g *fakeGuest, root string) (shared, system []string, unshares []protocol.MountSource) {
	g.mu.Lock()
	defer g.mu.Unlock()
	under := func(p string) bool { return strings.HasPrefix(p, root+"/") }
	shared = slices.DeleteFunc(slices.Clone(g.sharedPaths), func(p string) bool { return !under(p) })
	system = slices.DeleteFunc(slices.Clone(g.systemShares), func(p string) bool { return !under(p) })
	return shared, system, slices.Clone(g.unshares)
}

// Issue #42: the SDK binary never changes for a given file, so it goes
// through the guest's cached system share (SystemSharer: the kvm
// backend's cached device, which keeps it in the guest's page cache across
// spawns and sessions), never through the uncached session share.
func TestInstallSdkSharesTheBinaryAsASystemFile(t *testing.T) {
	e := newTestEnv(t)
	e.backend.systemSharer = true
	sdkRoot := t.TempDir()
	file := writeSDK(t, sdkRoot, "1.0.0", "#!/bin/sh\n")
	e.mustCall("installSdk", map[string]any{"sdkSubpath": rel(sdkRoot), "version": "1.0.0"}, nil)
	g := e.start()

	shared, system, _ := sdkShares(g, sdkRoot)
	assert.Empty(t, shared, "the SDK through the uncached Share")
	assert.Equal(t, []string{file}, system, "the SDK through ShareSystem")
	m, ok := g.agent.mountAt(GuestSDKPath)
	require.True(t, ok)
	assert.Equal(t, fakeSystemTag, m.Source.Tag, "mounted from the system share")
	assert.Equal(t, "claude", m.SourceFile)
	assert.True(t, m.ReadOnly)
}

// Issue #42: installSdk of another version, or of the same version whose
// file the host replaced (renamed over, or rewritten in place), shares the
// file afresh and withdraws the old export, on a guest with a system
// share and on one without (the process backend's binds); installSdk of an
// unchanged file changes nothing.
func TestInstallSdkSharesAChangedBinaryAfresh(t *testing.T) {
	for _, sharer := range []bool{false, true} {
		t.Run(map[bool]string{false: "Share", true: "ShareSystem"}[sharer], func(t *testing.T) {
			e := newTestEnv(t)
			e.backend.systemSharer = sharer
			sdkRoot := t.TempDir()
			v1 := writeSDK(t, sdkRoot, "1.0.0", "#!/bin/sh\necho 1\n")
			v2 := writeSDK(t, sdkRoot, "2.0.0", "#!/bin/sh\necho 2\n")
			install := func(version string) {
				t.Helper()
				e.mustCall("installSdk", map[string]any{"sdkSubpath": rel(sdkRoot), "version": version}, nil)
			}
			install("1.0.0")
			g := e.start()
			shares := func() []string {
				shared, system, _ := sdkShares(g, sdkRoot)
				return append(shared, system...)
			}
			mounted := func() protocol.MountSource {
				m, ok := g.agent.mountAt(GuestSDKPath)
				require.True(t, ok)
				return m.Source
			}
			first := mounted()

			install("2.0.0")
			require.Equal(t, []string{v1, v2}, shares(), "a new version is shared")
			assert.Equal(t, []protocol.MountSource{first}, waitUnshares(t, g, 1), "the old version's share withdrawn")
			second := mounted()

			install("2.0.0")
			require.Equal(t, []string{v1, v2}, shares(), "the same file again: nothing shared")
			assertNoMoreUnshares(t, g, 1)

			replaceSDK(t, sdkRoot, "2.0.0", "#!/bin/sh\necho 2, downloaded again\n")
			install("2.0.0")
			require.Equal(t, []string{v1, v2, v2}, shares(), "a file renamed over the version's is shared afresh")
			assert.Equal(t, []protocol.MountSource{first, second}, waitUnshares(t, g, 2), "the replaced file's share withdrawn")
			third := mounted()

			writeSDK(t, sdkRoot, "2.0.0", "#!/bin/sh\necho 2, rewritten in place, longer\n")
			install("2.0.0")
			require.Equal(t, []string{v1, v2, v2, v2}, shares(), "a file rewritten in place is shared afresh")
			assert.Equal(t, []protocol.MountSource{first, second, third}, waitUnshares(t, g, 3))
			if sharer {
				assert.NotEqual(t, third, mounted(), "the agent mounted the new share")
			}
		})
	}
}
