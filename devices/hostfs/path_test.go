package hostfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// PathOf gives the export name and the components a walk from the attach
// root takes to reach a node again, also after its client renamed it,
// and ESTALE once the export is withdrawn.
func TestPathOfLeadsBackToTheNode(t *testing.T) {
	h := newHarness(t)
	h.export(t, "e1", false, map[string]string{"a/b/c.txt": "c", "x/keep": ""})
	exp, comps, err := PathOf(h.attach(t, ""))
	require.NoError(t, err)
	require.Equal(t, "", exp)
	require.Empty(t, comps)

	root := h.attach(t, "e1")
	exp, comps, err = PathOf(root)
	require.NoError(t, err)
	require.Equal(t, "e1", exp)
	require.Empty(t, comps)

	c := walk(t, root, "a", "b", "c.txt")
	exp, comps, err = PathOf(c)
	require.NoError(t, err)
	require.Equal(t, "e1", exp)
	require.Equal(t, []string{"a", "b", "c.txt"}, comps)
	want, err := c.Stat()
	require.NoError(t, err)
	again := walk(t, h.attach(t, exp), comps...)
	got, err := again.Stat()
	require.NoError(t, err)
	require.Equal(t, want.Key, got.Key)

	x := walk(t, root, "x")
	require.NoError(t, walk(t, root, "a", "b").RenameAt("c.txt", x, "d.txt"))
	c.Renamed(x, "d.txt")
	_, comps, err = PathOf(c)
	require.NoError(t, err)
	require.Equal(t, []string{"x", "d.txt"}, comps)

	h.exports.Remove("e1")
	_, _, err = PathOf(c)
	require.ErrorIs(t, err, unix.ESTALE)
}

// A single-file export's file is reached by the name the export shows,
// not the host file's name behind a registered symlink.
func TestPathOfSingleFileUsesTheViewName(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "real.conf"), []byte("x"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(dir, "real.conf"), filepath.Join(dir, "link.conf")))
	require.NoError(t, h.exports.AddFile("cfg", filepath.Join(dir, "link.conf"), true))
	f := walk(t, h.attach(t, "cfg"), "link.conf")
	exp, comps, err := PathOf(f)
	require.NoError(t, err)
	require.Equal(t, "cfg", exp)
	require.Equal(t, []string{"link.conf"}, comps)
	require.NoError(t, walkPath(h.attach(t, exp), comps...))
	require.NoError(t, CheckName("link.conf"))
	require.Error(t, CheckName(".."))
}
