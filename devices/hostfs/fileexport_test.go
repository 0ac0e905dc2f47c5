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

// homeWithDotfile makes a home directory holding a dotfile beside secrets,
// as ~/.gitconfig sits beside ~/.ssh.
func homeWithDotfile(t *testing.T, h *harness) string {
	t.Helper()
	home := filepath.Join(h.base, "home")
	for name, content := range map[string]string{
		".gitconfig":      "[user]\n\tname = me\n",
		"secret":          "top secret",
		".ssh/id_ed25519": "private key",
	} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(home, name)), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(home, name), []byte(content), 0o600))
	}
	return home
}

// Issue #15 defect 2: a single-file mount exported its whole parent
// directory, writable. Only the one file is reachable now.
func TestFileExportReachesOnlyItsFile(t *testing.T) {
	h := newHarness(t)
	home := homeWithDotfile(t, h)
	require.NoError(t, h.exports.AddFile("gc", filepath.Join(home, ".gitconfig"), false))
	root := h.attach(t, "gc")

	assert.Equal(t, []string{".gitconfig"}, readdirNames(t, root), "the listing shows the one file")
	f := walk(t, root, ".gitconfig")
	_, err := f.Open(unix.O_RDWR)
	require.NoError(t, err)
	assert.Equal(t, "[user]\n\tname = me\n", readAll(t, f))
	_, err = writeAt(f, []byte("[USER]"), 0)
	require.NoError(t, err, "a read-write file export writes the file in place")
	b, _ := os.ReadFile(filepath.Join(home, ".gitconfig"))
	assert.Equal(t, "[USER]\n\tname = me\n", string(b))

	// Every other name is out of reach, through the server and directly.
	for _, names := range [][]string{{"secret"}, {".ssh"}, {".ssh", "id_ed25519"}, {".."}, {"."}} {
		assert.Error(t, walkPath(root, names...), "walk %q", names)
	}
	direct := directWalk(t, h.exports, "gc")
	for _, name := range []string{"secret", ".ssh", ".gitconfig.lock", "GITCONFIG"} {
		_, _, err := direct.Walk(name)
		assert.ErrorIs(t, err, unix.ENOENT, "direct walk %q", name)
	}
	for _, name := range []string{"..", ".", "", "../home/secret", ".gitconfig/.."} {
		_, _, err := direct.Walk(name)
		assert.ErrorIs(t, err, unix.EINVAL, "direct walk %q", name)
	}
	_, _, err = directWalk(t, h.exports, "gc", ".gitconfig").Walk("x")
	assert.ErrorIs(t, err, unix.ENOTDIR, "the file leads nowhere")

	// No name in the view can be made, removed or renamed; the host
	// directory around the file cannot be changed either.
	target := walk(t, root, ".gitconfig")
	refused := creations(t, root, target, "planted")
	maps.Copy(refused, map[string]func() error{
		"renameat":        func() error { return root.RenameAt(".gitconfig", root, "planted") },
		"renameat-other":  func() error { return root.RenameAt("secret", root, ".gitconfig") },
		"rename":          func() error { return walk(t, root, ".gitconfig").Rename(root, "planted") },
		"unlinkat":        func() error { return root.UnlinkAt(".gitconfig", 0) },
		"unlinkat-other":  func() error { return root.UnlinkAt("secret", 0) },
		"rmdir-other":     func() error { return root.UnlinkAt(".ssh", unix.AT_REMOVEDIR) },
		"chmod-directory": func() error { return root.SetAttr(SetAttr{Valid: SetMode, Mode: 0o777}) },
	})
	for name, op := range refused {
		assert.ErrorIs(t, op(), unix.EPERM, name)
	}
	ents, err := os.ReadDir(home)
	require.NoError(t, err)
	assert.Len(t, ents, 3, "nothing created or removed on the host")
	st, err := os.Stat(home)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the home directory's mode is untouched")
	b, _ = os.ReadFile(filepath.Join(home, "secret"))
	assert.Equal(t, "top secret", string(b))

	// The file itself may change its own attributes in a read-write export.
	require.NoError(t, target.SetAttr(SetAttr{Valid: SetMode, Mode: 0o640}))
	st, _ = os.Stat(filepath.Join(home, ".gitconfig"))
	assert.Equal(t, os.FileMode(0o640), st.Mode().Perm())
}

func TestReadOnlyFileExportRefusesWrites(t *testing.T) {
	h := newHarness(t)
	sdk := filepath.Join(h.base, "sdk", "1.0.0")
	require.NoError(t, os.MkdirAll(sdk, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sdk, "claude"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sdk, "other"), []byte("other"), 0o644))
	require.NoError(t, h.exports.AddFile("sdk", filepath.Join(sdk, "claude"), true))
	root := h.attach(t, "sdk")

	assert.Equal(t, []string{"claude"}, readdirNames(t, root))
	f := walk(t, root, "claude")
	_, err := f.Open(unix.O_RDONLY)
	require.NoError(t, err)
	assert.Equal(t, "#!/bin/sh\n", readAll(t, f))
	_, err = walk(t, root, "claude").Open(unix.O_WRONLY)
	assert.ErrorIs(t, err, unix.EROFS)
	assert.ErrorIs(t, walk(t, root, "claude").SetAttr(SetAttr{Valid: SetSize}), unix.EROFS)
	_, err = root.Mkdir("x", 0o755)
	assert.ErrorIs(t, err, unix.EROFS)
	_, _, err = root.Walk("other")
	assert.ErrorIs(t, err, unix.ENOENT)
}

// The file is found by name at each open: an editor saving by rename-over
// on the host is seen; a symlink or directory put in its place is not
// followed, and a fid keeps the last regular file it reached.
func TestFileExportFollowsRenameOverOnTheHost(t *testing.T) {
	h := newHarness(t)
	home := homeWithDotfile(t, h)
	path := filepath.Join(home, ".gitconfig")
	require.NoError(t, h.exports.AddFile("gc", path, false))
	root := h.attach(t, "gc")
	held := walk(t, root, ".gitconfig") // as the guest's bind mount holds it

	save := func(content string) {
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
		require.NoError(t, os.Rename(tmp, path))
	}
	open := func() string {
		f := walk(t, held)
		_, err := f.Open(unix.O_RDONLY)
		require.NoError(t, err)
		return readAll(t, f)
	}
	save("saved by an editor, longer than before\n")
	assert.Equal(t, "saved by an editor, longer than before\n", open())
	attr, err := held.Stat()
	require.NoError(t, err)
	assert.Equal(t, int64(len("saved by an editor, longer than before\n")), attr.Stat.Size, "attributes follow the name too")

	// A symlink to the secret put in its place is not followed.
	require.NoError(t, os.Rename(path, path+".bak"))
	require.NoError(t, os.Symlink(filepath.Join(home, "secret"), path))
	assert.Equal(t, "saved by an editor, longer than before\n", open(), "the last regular file stays")
	_, _, err = root.Walk(".gitconfig")
	assert.ErrorIs(t, err, unix.ENOENT, "a fresh walk finds no regular file")
	assert.Empty(t, readdirNames(t, root))
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.Mkdir(path, 0o700))
	assert.Equal(t, "saved by an editor, longer than before\n", open())
	require.NoError(t, os.Remove(path))
	save("back\n")
	assert.Equal(t, "back\n", open())
}

func TestAddFileRegistration(t *testing.T) {
	h := newHarness(t)
	home := homeWithDotfile(t, h)
	// A symlinked dotfile is resolved once, at registration, and shown
	// under the name the caller gave.
	dotfiles := filepath.Join(h.base, "dotfiles")
	require.NoError(t, os.MkdirAll(dotfiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dotfiles, "gitconfig"), []byte("from dotfiles"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dotfiles, "neighbour"), []byte("neighbour"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(dotfiles, "gitconfig"), filepath.Join(home, ".linked")))
	require.NoError(t, h.exports.AddFile("linked", filepath.Join(home, ".linked"), true))
	root := h.attach(t, "linked")
	assert.Equal(t, []string{".linked"}, readdirNames(t, root))
	f := walk(t, root, ".linked")
	_, err := f.Open(unix.O_RDONLY)
	require.NoError(t, err)
	assert.Equal(t, "from dotfiles", readAll(t, f))
	for _, name := range []string{"gitconfig", "neighbour"} {
		_, _, err = root.Walk(name)
		assert.ErrorIs(t, err, unix.ENOENT, name)
	}

	assert.Error(t, h.exports.AddFile("dir", home, false), "a directory is not a file")
	assert.Error(t, h.exports.AddFile("missing", filepath.Join(home, "missing"), false))
	assert.Error(t, h.exports.AddFile("relative", ".gitconfig", false))
	assert.Error(t, h.exports.AddFile("a/b", filepath.Join(home, ".gitconfig"), false))
	assert.ErrorIs(t, h.exports.AddFile("linked", filepath.Join(home, ".gitconfig"), false), ErrExportExists)
	assert.Equal(t, []string{"linked"}, h.exports.Names())
}

// creations are the operations that add name to dir: a file, a directory,
// a symlink, a FIFO and a hard link to linkTarget.
func creations(t *testing.T, dir, linkTarget Node, name string) map[string]func() error {
	return map[string]func() error{
		"create": func() error {
			_, _, err := walk(t, dir).Create(name, unix.O_RDWR, 0o644)
			return err
		},
		"mkdir":   func() error { _, err := dir.Mkdir(name, 0o755); return err },
		"symlink": func() error { _, err := dir.Symlink("x", name); return err },
		"mknod": func() error {
			_, err := dir.Mknod(name, uint32(unix.S_IFIFO|0o644))
			return err
		},
		"link": func() error { return dir.Link(linkTarget, name) },
	}
}

// Issue #42: an immutable single-file export (the SDK binary, cached by
// the guest for good) is pinned to the file it was registered with: a
// file renamed over it on the host is never what the guest reaches
// through it, by a held node, a fresh walk, a listing or a key lookup; it
// is read-only; its removal closes the pinned descriptor too.
func TestImmutableFileExportIsPinned(t *testing.T) {
	h := newHarness(t)
	fdsBefore := openFds(t)
	dir := filepath.Join(h.base, "sdk", "1.0.0")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, "claude")
	require.NoError(t, os.WriteFile(path, []byte("as installed"), 0o755))
	require.NoError(t, h.exports.AddImmutableFile("sdk", path))
	root, _, err := h.exports.Root().Walk("sdk")
	require.NoError(t, err)
	held, attr, err := root.Walk("claude")
	require.NoError(t, err)

	tmp := path + ".download"
	require.NoError(t, os.WriteFile(tmp, []byte("re-downloaded, another file"), 0o755))
	require.NoError(t, os.Rename(tmp, path))

	a, err := held.Stat()
	require.NoError(t, err)
	assert.Equal(t, attr.Key, a.Key, "the held node's attributes are the pinned file's")
	assert.EqualValues(t, len("as installed"), a.Stat.Size)
	fresh, fattr, err := root.Walk("claude")
	require.NoError(t, err)
	assert.Equal(t, attr.Key, fattr.Key, "a fresh walk reaches the pinned file")
	_, err = fresh.Open(unix.O_RDONLY)
	require.NoError(t, err)
	assert.Equal(t, "as installed", readAll(t, fresh))
	_, err = held.Open(unix.O_RDWR)
	assert.ErrorIs(t, err, unix.EROFS)
	key, err := root.ChildKey("claude")
	require.NoError(t, err)
	assert.Equal(t, attr.Key, key)
	list, err := root.Clone()
	require.NoError(t, err)
	_, err = list.Open(unix.O_RDONLY)
	require.NoError(t, err)
	ents, err := list.Readdir(0, 4096)
	require.NoError(t, err)
	require.Len(t, ents, 3)
	assert.Equal(t, attr.Key.GuestIno(), ents[2].Ino, "the listing shows the pinned file")

	h.exports.Remove("sdk")
	assert.Equal(t, fdsBefore, openFds(t), "every descriptor closed, the pinned one too")
	_, err = held.Stat()
	assert.ErrorIs(t, err, unix.ESTALE)
	for _, n := range []Node{list, fresh, held, root} {
		_ = n.Close()
	}
}
