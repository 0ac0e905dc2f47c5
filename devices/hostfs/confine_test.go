package hostfs

import (
	"maps"
	"os"
	"path/filepath"
	"testing"

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
	_, err := f.Open(unix.O_RDONLY)
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
			return walk(t, root, "f.txt").SetAttr(SetAttr{Valid: SetSize, Size: 0})
		},
		"setattr-mode": func() error {
			return walk(t, root, "f.txt").SetAttr(SetAttr{Valid: SetMode, Mode: 0o777})
		},
		"setattr-times": func() error {
			return walk(t, root, "f.txt").SetAttr(SetAttr{Valid: SetMTime, MTime: SetTime(true, 0, 0)})
		},
		"open-write": func() error { _, err := walk(t, root, "f.txt").Open(unix.O_WRONLY); return err },
		"open-rdwr":  func() error { _, err := walk(t, root, "f.txt").Open(unix.O_RDWR); return err },
		"open-trunc": func() error {
			_, err := walk(t, root, "f.txt").Open(unix.O_RDONLY | unix.O_TRUNC)
			return err
		},
	})
	for name, op := range mutations {
		assert.ErrorIs(t, op(), unix.EROFS, name)
	}

	// Directly on the file system too (the write path and xattrs).
	direct := directWalk(t, h.exports, "ro", "f.txt")
	_, err = direct.Open(unix.O_RDONLY)
	require.NoError(t, err)
	_, err = writeAt(direct, []byte("x"), 0)
	assert.ErrorIs(t, err, unix.EROFS, "write")
	assert.ErrorIs(t, direct.SetXattr("user.a", []byte("b"), 0), unix.EROFS, "setxattr")
	assert.ErrorIs(t, direct.RemoveXattr("user.a"), unix.EROFS, "removexattr")

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
		assert.Error(t, walkPath(root, names...), "walk %q", names)
	}
	// The same refusal for every name a walk is given.
	rootDirect := directWalk(t, h.exports, "x")
	for _, name := range []string{"..", ".", "", "../outside", "sub/../../outside", "/etc", "a\x00b"} {
		_, _, err := rootDirect.Walk(name)
		assert.ErrorIs(t, err, unix.EINVAL, "direct walk %q", name)
	}
	// And for names in creating operations.
	for _, name := range []string{"..", "../evil", "/abs", ""} {
		_, err := rootDirect.Mkdir(name, 0o755)
		assert.Error(t, err, "mkdir %q", name)
		_, _, err = rootDirect.Create(name, unix.O_RDWR, 0o644)
		assert.Error(t, err, "create %q", name)
		assert.Error(t, rootDirect.RenameAt("sub", rootDirect, name), "rename to %q", name)
	}
	_, err := os.Stat(filepath.Join(h.base, "evil"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	// Attach names cannot climb either.
	for _, aname := range []string{"..", "x/..", "../outside", "nope"} {
		_, _, err := h.exports.Root().Walk(aname)
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
		assert.Error(t, walkPath(root, link, "secret"), "walk through %s", link)
		// Directly: walking from the link node does not follow it.
		l := directWalk(t, h.exports, "x", link)
		_, _, err := l.Walk("secret")
		assert.ErrorIs(t, err, unix.ENOTDIR, "direct walk through %s", link)
		_, err = l.Mkdir("planted", 0o755)
		assert.Error(t, err, "mkdir through %s", link)
	}
	for _, link := range []string{"absfile", "relfile"} {
		l := walk(t, root, link)
		_, err := l.Open(unix.O_RDONLY)
		assert.Error(t, err, "open %s", link)
		target, err := l.Readlink()
		require.NoError(t, err)
		assert.Contains(t, target, "outside", "the guest sees the link text, nothing more")
		// Direct: open, truncate, chmod of a link node are refused.
		d := directWalk(t, h.exports, "x", link)
		_, err = d.Open(unix.O_RDWR)
		assert.Error(t, err)
		assert.Error(t, d.SetAttr(SetAttr{Valid: SetSize, Size: 0}))
		assert.Error(t, d.SetAttr(SetAttr{Valid: SetMode, Mode: 0o777}))
		plain := directWalk(t, h.exports, "x")
		assert.Error(t, plain.Link(d, "hard-to-link"), "no hard link to a symlink node")
	}
	// Creating a file whose name is an existing dangling-outside link does
	// not write through it.
	_, _, err := walk(t, root).Create("absfile", unix.O_RDWR, 0o644)
	assert.ErrorIs(t, err, unix.EEXIST)

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
	_, _, err := d.Walk("secret")
	assert.ErrorIs(t, err, unix.ENOENT, "the held directory is the original one")
	f := walk(t, d, "inside")
	_, err = f.Open(unix.O_RDONLY)
	require.NoError(t, err)
	assert.Equal(t, "inside", readAll(t, f))

	// Creating through the held fid lands in the original directory.
	nf, _, err := walk(t, d).Create("created", unix.O_RDWR, 0o644)
	require.NoError(t, err)
	require.NoError(t, nf.Close())
	_, err = os.Stat(filepath.Join(dir, "d.orig", "created"))
	assert.NoError(t, err)
	_, err = os.Stat(filepath.Join(secretDir, "created"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	// A fresh walk sees the link and cannot pass through it.
	assert.Error(t, walkPath(root, "d", "secret"))

	// A file node swapped for a link after the walk: open goes to the
	// original inode (held descriptor), never to the link target.
	g := walk(t, d, "inside")
	require.NoError(t, os.Rename(filepath.Join(dir, "d.orig", "inside"), filepath.Join(dir, "d.orig", "inside.orig")))
	require.NoError(t, os.Symlink(filepath.Join(secretDir, "secret"), filepath.Join(dir, "d.orig", "inside")))
	_, err = g.Open(unix.O_RDWR)
	require.NoError(t, err)
	_, err = writeAt(g, []byte("INSIDE"), 0)
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
	_, err := root.Mkdir("c", 0o755)
	assert.ErrorIs(t, err, unix.EROFS)
	a := walk(t, root, "a")
	_, err = a.Mkdir("inside-a", 0o755)
	assert.NoError(t, err, "an export reached by name works")
	assert.ErrorIs(t, root.RenameAt("a", root, "z"), unix.EROFS)

	// Cross-export operations are refused.
	b := walk(t, root, "b")
	assert.ErrorIs(t, a.RenameAt("inside-a", b, "moved"), unix.EXDEV)
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
	root := x.Root()
	held, _, err := root.Walk("s1")
	require.NoError(t, err)
	x.Remove("s1")
	_, _, err = root.Walk("s1")
	assert.ErrorIs(t, err, unix.ENOENT)
	_, err = held.Mkdir("after-removal", 0o755)
	assert.ErrorIs(t, err, unix.ESTALE)
	assert.NoDirExists(t, filepath.Join(dir, "after-removal"))
	require.NoError(t, held.Close())
	x.Remove("s1") // unknown: no-op
}
