package hostfs

import (
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestReadOnlyExportRefusesEveryMutation(t *testing.T) {
	h := newHarness(t)
	dir := h.export(t, "ro", true, map[string]string{"f.txt": "keep", "d/g.txt": "keep too"})
	root := h.attach(t, "ro")

	// Reading works.
	f := walk(t, root, "f.txt")
	_, _, err := f.Open(p9.ReadOnly)
	require.NoError(t, err)
	assert.Equal(t, "keep", readAll(t, f))
	assert.Equal(t, []string{"d", "f.txt"}, readdirNames(t, root))

	d := walk(t, root, "d")
	target := walk(t, root, "f.txt")
	mutations := creations(t, root, target, "new")
	maps.Copy(mutations, map[string]func() error{
		"renameat": func() error { return root.RenameAt("f.txt", d, "moved") },
		"rename":   func() error { return walk(t, root, "f.txt").Rename(d, "moved") },
		"unlinkat": func() error { return root.UnlinkAt("f.txt", 0) },
		"rmdir":    func() error { return root.UnlinkAt("d", unix.AT_REMOVEDIR) },
		"setattr-size": func() error {
			return walk(t, root, "f.txt").SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0})
		},
		"setattr-mode": func() error {
			return walk(t, root, "f.txt").SetAttr(p9.SetAttrMask{Permissions: true}, p9.SetAttr{Permissions: 0o777})
		},
		"setattr-times": func() error {
			return walk(t, root, "f.txt").SetAttr(p9.SetAttrMask{MTime: true}, p9.SetAttr{})
		},
		"open-write": func() error { _, _, err := walk(t, root, "f.txt").Open(p9.WriteOnly); return err },
		"open-rdwr":  func() error { _, _, err := walk(t, root, "f.txt").Open(p9.ReadWrite); return err },
		"open-trunc": func() error {
			_, _, err := walk(t, root, "f.txt").Open(p9.ReadOnly | p9.OpenFlags(unix.O_TRUNC))
			return err
		},
	})
	for name, op := range mutations {
		assert.ErrorIs(t, op(), linux.EROFS, name)
	}

	// Directly on the file system too (the write path and xattrs).
	direct := directWalk(t, h.exports, "ro", "f.txt")
	_, _, err = direct.Open(p9.ReadOnly)
	require.NoError(t, err)
	_, err = direct.WriteAt([]byte("x"), 0)
	assert.ErrorIs(t, err, linux.EROFS, "write")
	assert.ErrorIs(t, direct.SetXattr("user.a", []byte("b"), 0), linux.EROFS, "setxattr")
	assert.ErrorIs(t, direct.RemoveXattr("user.a"), linux.EROFS, "removexattr")

	b, err := os.ReadFile(filepath.Join(dir, "f.txt"))
	require.NoError(t, err)
	assert.Equal(t, "keep", string(b), "host file untouched")
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, ents, 2, "nothing created on the host")
}

// outside makes a secret beside the export, which no walk may reach.
func outside(t *testing.T, h *harness) string {
	t.Helper()
	secretDir := filepath.Join(h.base, "outside")
	require.NoError(t, os.MkdirAll(secretDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(secretDir, "secret"), []byte("top secret"), 0o644))
	return secretDir
}

func TestEscapeThroughDotDotRefused(t *testing.T) {
	h := newHarness(t)
	outside(t, h)
	h.export(t, "x", false, map[string]string{"sub/a": "a"})
	root := h.attach(t, "x")

	for _, names := range [][]string{{".."}, {"sub", "..", ".."}, {"."}, {"sub/.."}, {""}} {
		_, _, err := root.Walk(names)
		assert.Error(t, err, "walk %q", names)
	}
	// The same refusal without the p9 server's own checks.
	rootDirect := directWalk(t, h.exports, "x")
	for _, name := range []string{"..", ".", "", "../outside", "sub/../../outside", "/etc", "a\x00b"} {
		_, _, err := rootDirect.Walk([]string{name})
		assert.ErrorIs(t, err, linux.EINVAL, "direct walk %q", name)
	}
	// And for names in creating operations.
	for _, name := range []string{"..", "../evil", "/abs", ""} {
		_, err := rootDirect.Mkdir(name, 0o755, p9.NoUID, p9.NoGID)
		assert.Error(t, err, "mkdir %q", name)
		_, _, _, err = rootDirect.Create(name, p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID)
		assert.Error(t, err, "create %q", name)
		assert.Error(t, rootDirect.RenameAt("sub", rootDirect, name), "rename to %q", name)
	}
	_, err := os.Stat(filepath.Join(h.base, "evil"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	// Attach names cannot climb either.
	for _, aname := range []string{"..", "x/..", "../outside", "nope"} {
		_, err := h.client.Attach(aname)
		assert.Error(t, err, "attach %q", aname)
	}
}

func TestEscapeThroughSymlinksRefused(t *testing.T) {
	h := newHarness(t)
	secretDir := outside(t, h)
	dir := h.export(t, "x", false, map[string]string{"plain": "p"})
	require.NoError(t, os.Symlink(secretDir, filepath.Join(dir, "abs")))    // absolute, to a dir outside
	require.NoError(t, os.Symlink("../outside", filepath.Join(dir, "rel"))) // relative, to a dir outside
	require.NoError(t, os.Symlink(filepath.Join(secretDir, "secret"), filepath.Join(dir, "absfile")))
	require.NoError(t, os.Symlink("../outside/secret", filepath.Join(dir, "relfile")))
	root := h.attach(t, "x")

	for _, link := range []string{"abs", "rel"} {
		_, _, err := root.Walk([]string{link, "secret"})
		assert.Error(t, err, "walk through %s", link)
		// Directly: walking from the link node does not follow it.
		l := directWalk(t, h.exports, "x", link)
		_, _, err = l.Walk([]string{"secret"})
		assert.ErrorIs(t, err, linux.ENOTDIR, "direct walk through %s", link)
		_, err = l.Mkdir("planted", 0o755, p9.NoUID, p9.NoGID)
		assert.Error(t, err, "mkdir through %s", link)
	}
	for _, link := range []string{"absfile", "relfile"} {
		l := walk(t, root, link)
		_, _, err := l.Open(p9.ReadOnly)
		assert.Error(t, err, "open %s", link)
		target, err := l.Readlink()
		require.NoError(t, err)
		assert.Contains(t, target, "outside", "the guest sees the link text, nothing more")
		// Direct: open, truncate, chmod of a link node are refused.
		d := directWalk(t, h.exports, "x", link)
		_, _, err = d.Open(p9.ReadWrite)
		assert.Error(t, err)
		assert.Error(t, d.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0}))
		assert.Error(t, d.SetAttr(p9.SetAttrMask{Permissions: true}, p9.SetAttr{Permissions: 0o777}))
		plain := directWalk(t, h.exports, "x")
		assert.Error(t, plain.Link(d, "hard-to-link"), "no hard link to a symlink node")
	}
	// Creating a file whose name is an existing dangling-outside link does
	// not write through it.
	_, _, _, err := walk(t, root).Create("absfile", p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID)
	assert.ErrorIs(t, err, linux.EEXIST)

	b, err := os.ReadFile(filepath.Join(secretDir, "secret"))
	require.NoError(t, err)
	assert.Equal(t, "top secret", string(b))
	st, err := os.Stat(filepath.Join(secretDir, "secret"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())
	_, err = os.Stat(filepath.Join(secretDir, "planted"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestSymlinkSwappedInDuringWalkRefused(t *testing.T) {
	h := newHarness(t)
	secretDir := outside(t, h)
	dir := h.export(t, "x", false, map[string]string{"d/inside": "inside"})
	root := h.attach(t, "x")

	// The guest holds a fid for d; then d is swapped for a link to outside.
	d := walk(t, root, "d")
	require.NoError(t, os.Rename(filepath.Join(dir, "d"), filepath.Join(dir, "d.orig")))
	require.NoError(t, os.Symlink(secretDir, filepath.Join(dir, "d")))

	// Walking on from the held fid stays in the original directory.
	_, _, err := d.Walk([]string{"secret"})
	assert.ErrorIs(t, err, linux.ENOENT, "the held directory is the original one")
	f := walk(t, d, "inside")
	_, _, err = f.Open(p9.ReadOnly)
	require.NoError(t, err)
	assert.Equal(t, "inside", readAll(t, f))

	// Creating through the held fid lands in the original directory.
	nf, _, _, err := walk(t, d).Create("created", p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	require.NoError(t, nf.Close())
	_, err = os.Stat(filepath.Join(dir, "d.orig", "created"))
	assert.NoError(t, err)
	_, err = os.Stat(filepath.Join(secretDir, "created"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	// A fresh walk sees the link and cannot pass through it.
	_, _, err = root.Walk([]string{"d", "secret"})
	assert.Error(t, err)

	// A file node swapped for a link after the walk: open goes to the
	// original inode (held descriptor), never to the link target.
	g := walk(t, d, "inside")
	require.NoError(t, os.Rename(filepath.Join(dir, "d.orig", "inside"), filepath.Join(dir, "d.orig", "inside.orig")))
	require.NoError(t, os.Symlink(filepath.Join(secretDir, "secret"), filepath.Join(dir, "d.orig", "inside")))
	_, _, err = g.Open(p9.ReadWrite)
	require.NoError(t, err)
	_, err = g.WriteAt([]byte("INSIDE"), 0)
	require.NoError(t, err)
	b, _ := os.ReadFile(filepath.Join(secretDir, "secret"))
	assert.Equal(t, "top secret", string(b), "the outside file is untouched")
	b, _ = os.ReadFile(filepath.Join(dir, "d.orig", "inside.orig"))
	assert.Equal(t, "INSIDE", string(b), "the write went to the walked inode")
}

func TestVirtualRootIsUnlistableAndReadOnly(t *testing.T) {
	h := newHarness(t)
	h.export(t, "a", false, nil)
	h.export(t, "b", true, nil)
	root := h.attach(t, "")
	assert.Empty(t, readdirNames(t, root), "export names are not listed")
	_, err := root.Mkdir("c", 0o755, p9.NoUID, p9.NoGID)
	assert.ErrorIs(t, err, linux.EROFS)
	a := walk(t, root, "a")
	_, err = a.Mkdir("inside-a", 0o755, p9.NoUID, p9.NoGID)
	assert.NoError(t, err, "an export reached by name works")
	assert.ErrorIs(t, root.RenameAt("a", root, "z"), linux.EROFS)

	// Cross-export operations are refused.
	b := walk(t, root, "b")
	assert.ErrorIs(t, a.RenameAt("inside-a", b, "moved"), linux.EXDEV)
}

func TestExportsRegistry(t *testing.T) {
	x := NewExports(discard())
	defer x.Close()
	dir := t.TempDir()
	require.NoError(t, x.Add("s1", dir, false))
	assert.ErrorIs(t, x.Add("s1", dir, true), ErrExportExists)
	assert.Error(t, x.Add("a/b", dir, false), "export names are one component")
	assert.Error(t, x.Add("..", dir, false))
	assert.Error(t, x.Add("missing", filepath.Join(dir, "nope"), false))
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	assert.Error(t, x.Add("file", file, false), "an export is a directory")
	assert.Equal(t, []string{"s1"}, x.Names())

	// A removed export is gone, also for the files already held.
	root, err := x.Attach()
	require.NoError(t, err)
	_, held, err := root.Walk([]string{"s1"})
	require.NoError(t, err)
	x.Remove("s1")
	_, _, err = root.Walk([]string{"s1"})
	assert.ErrorIs(t, err, linux.ENOENT)
	_, err = held.Mkdir("after-removal", 0o755, p9.NoUID, p9.NoGID)
	assert.ErrorIs(t, err, linux.ESTALE)
	assert.NoDirExists(t, filepath.Join(dir, "after-removal"))
	require.NoError(t, held.Close())
	x.Remove("s1") // unknown: no-op
}
