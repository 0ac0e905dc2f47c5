package helper

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSystemLink: a system directory that is a symlink into another one
// (merged /usr) is sent as that symlink; one pointing anywhere else, a
// real directory and a missing one are not.
func TestSystemLink(t *testing.T) {
	root := t.TempDir()
	at := func(p string) string { return filepath.Join(root, p) }
	require.NoError(t, os.MkdirAll(at("usr/bin"), 0o755))
	require.NoError(t, os.MkdirAll(at("elsewhere"), 0o755))
	require.NoError(t, os.MkdirAll(at("etc"), 0o755))
	require.NoError(t, os.Symlink("usr/bin", at("bin")))
	require.NoError(t, os.Symlink(at("usr/lib64"), at("lib64"))) // absolute, into /usr
	require.NoError(t, os.Symlink("elsewhere", at("opt")))
	require.NoError(t, os.Symlink("usr", at("usrlink")))
	dirs := []string{at("usr"), at("bin"), at("lib64"), at("etc"), at("opt"), at("usrlink"), at("missing")}

	link, ok := systemLink(at("bin"), dirs)
	assert.True(t, ok)
	assert.Equal(t, "usr/bin", link, "the link's own text, as the host has it")
	link, ok = systemLink(at("lib64"), dirs)
	assert.True(t, ok)
	assert.Equal(t, at("usr/lib64"), link)
	link, ok = systemLink(at("usrlink"), dirs)
	assert.True(t, ok, "a link to a system directory itself")
	assert.Equal(t, "usr", link)
	for _, d := range []string{"opt", "etc", "usr", "missing"} {
		_, ok := systemLink(at(d), dirs)
		assert.False(t, ok, d)
	}
	// Into a system directory that is itself a symlink: shared as before.
	_, ok = systemLink(at("bin"), []string{at("bin"), at("usrlink")})
	assert.False(t, ok)
}
