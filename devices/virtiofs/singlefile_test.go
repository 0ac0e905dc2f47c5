package virtiofs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// home makes a home directory holding a dotfile beside secrets, as
// ~/.gitconfig sits beside ~/.ssh.
func home(t *testing.T, r *rig) string {
	t.Helper()
	dir := filepath.Join(r.dir, "home")
	for name, content := range map[string]string{
		".gitconfig": "[user]\n\tname = me\n", "secret": "top secret", ".ssh/id_ed25519": "private key",
	} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
	}
	return dir
}

// A single-file export (hostfs.Exports.AddFile) shows its one file: listed,
// read and written in place, chmod-able; nothing else of the directory
// holding it is visible, and no name in it can be made, removed or renamed.
func TestSingleFileExportReachesOnlyItsFile(t *testing.T) {
	r := newRig(t, Options{})
	h := home(t, r)
	require.NoError(t, r.exports.AddFile("gc", filepath.Join(h, ".gitconfig"), false))
	r.initSession(t)
	view := r.walk(t, "gc")
	before := snapshot(t, h)

	o, errno := r.opendir(t, view)
	require.Zero(t, errno)
	ents := r.listDir(t, view, o.Fh, opReaddirplus, 4096)
	require.Equal(t, []string{".", "..", ".gitconfig"}, names(ents), "the listing shows the one file")
	require.EqualValues(t, len("[user]\n\tname = me\n"), ents[2].entry.Attr.Size)
	require.Equal(t, []string{".", "..", ".gitconfig"}, names(r.listDir(t, view, o.Fh, opReaddir, 4096)))

	for _, name := range []string{"secret", ".ssh", ".gitconfig.lock", "GITCONFIG", "home"} {
		_, errno := r.lookup(t, view, name)
		require.Equal(t, syscall.ENOENT, errno, "lookup %q", name)
	}
	for _, name := range []string{"..", ".", "", "../home/secret", ".gitconfig/.."} {
		_, errno := r.lookup(t, view, name)
		require.Equal(t, syscall.EINVAL, errno, "lookup %q", name)
	}
	f := r.walk(t, "gc", ".gitconfig")
	_, errno = r.lookup(t, f, "x")
	require.Equal(t, syscall.ENOTDIR, errno, "the file leads nowhere")

	for name, errno := range map[string]syscall.Errno{
		"create":        func() syscall.Errno { _, e := r.create(t, view, "planted", syscall.O_RDWR, 0o644); return e }(),
		"create-secret": func() syscall.Errno { _, e := r.create(t, view, "secret", syscall.O_RDWR, 0o644); return e }(),
		"mkdir":         func() syscall.Errno { _, e := r.mkdir(t, view, "planted", 0o755); return e }(),
		"mknod":         func() syscall.Errno { _, e := r.mknod(t, view, "planted", syscall.S_IFIFO|0o644, 0); return e }(),
		"symlink":       func() syscall.Errno { _, e := r.symlink(t, view, "planted", "secret"); return e }(),
		"link":          func() syscall.Errno { _, e := r.link(t, f, view, "planted"); return e }(),
		"rename":        r.rename(t, view, ".gitconfig", view, "planted"),
		"rename-other":  r.rename(t, view, "secret", view, ".gitconfig"),
		"unlink":        r.unlink(t, view, ".gitconfig"),
		"unlink-other":  r.unlink(t, view, "secret"),
		"rmdir-other":   r.rmdir(t, view, ".ssh"),
		"chmod-view": func() syscall.Errno {
			_, e := r.setattr(t, view, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o777})
			return e
		}(),
	} {
		require.Equal(t, syscall.EPERM, errno, name)
	}
	require.Equal(t, before, snapshot(t, h), "the home directory as it was")

	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	data, errno := r.read(t, f, fh, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "[user]\n\tname = me\n", string(data))
	_, errno = r.write(t, f, fh, 0, []byte("[USER]"))
	require.Zero(t, errno, "a read-write file export writes the file in place")
	got, _ := os.ReadFile(filepath.Join(h, ".gitconfig"))
	require.Equal(t, "[USER]\n\tname = me\n", string(got))
	_, errno = r.setattr(t, f, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o640})
	require.Zero(t, errno)
	require.Equal(t, uint32(0o640), hostPerm(t, filepath.Join(h, ".gitconfig")))
	got, _ = os.ReadFile(filepath.Join(h, "secret"))
	require.Equal(t, "top secret", string(got))
}

func TestReadOnlySingleFileExport(t *testing.T) {
	r := newRig(t, Options{})
	h := home(t, r)
	require.NoError(t, r.exports.AddFile("gc", filepath.Join(h, ".gitconfig"), true))
	r.initSession(t)
	f := r.walk(t, "gc", ".gitconfig")
	fh, errno := r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	data, errno := r.read(t, f, fh, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "[user]\n\tname = me\n", string(data))
	_, errno = r.write(t, f, fh, 0, []byte("x"))
	require.Equal(t, syscall.EROFS, errno)
	_, errno = r.open(t, f, syscall.O_RDWR)
	require.Equal(t, syscall.EROFS, errno)
	_, errno = r.setattr(t, f, setattrIn{Valid: fuse.FATTR_SIZE})
	require.Equal(t, syscall.EROFS, errno)
	_, errno = r.mkdir(t, r.walk(t, "gc"), "x", 0o755)
	require.Equal(t, syscall.EROFS, errno)
	got, _ := os.ReadFile(filepath.Join(h, ".gitconfig"))
	require.Equal(t, "[user]\n\tname = me\n", string(got))
}

// The file is found by name at each OPEN and GETATTR: an editor saving by
// rename-over on the host is seen through the node the guest holds; a
// symlink or a directory put in its place is never followed, the node
// keeps the last regular file.
func TestSingleFileExportFollowsRenameOverOnTheHost(t *testing.T) {
	r := newRig(t, Options{})
	h := home(t, r)
	path := filepath.Join(h, ".gitconfig")
	require.NoError(t, r.exports.AddFile("gc", path, false))
	r.initSession(t)
	view := r.walk(t, "gc")
	held := r.walk(t, "gc", ".gitconfig") // as the guest's bind mount holds it

	save := func(content string) {
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
		require.NoError(t, os.Rename(tmp, path))
	}
	open := func() string {
		t.Helper()
		fh, errno := r.open(t, held, syscall.O_RDONLY)
		require.Zero(t, errno)
		defer r.release(t, held, fh, opRelease)
		data, errno := r.read(t, held, fh, 0, 4096)
		require.Zero(t, errno)
		return string(data)
	}
	const saved = "saved by an editor, longer than before\n"
	save(saved)
	require.Equal(t, saved, open())
	a, errno := r.getattr(t, held)
	require.Zero(t, errno)
	require.EqualValues(t, len(saved), a.Attr.Size, "attributes follow the name too")

	// Written through the held node after the save: the new file.
	fh, errno := r.open(t, held, syscall.O_RDWR)
	require.Zero(t, errno)
	_, errno = r.write(t, held, fh, 0, []byte("SAVED"))
	require.Zero(t, errno)
	r.release(t, held, fh, opRelease)
	got, _ := os.ReadFile(path)
	require.Equal(t, "SAVED by an editor, longer than before\n", string(got))

	// A symlink to the secret put in its place is not followed.
	require.NoError(t, os.Rename(path, path+".bak"))
	require.NoError(t, os.Symlink(filepath.Join(h, "secret"), path))
	require.Equal(t, "SAVED by an editor, longer than before\n", open(), "the last regular file stays")
	_, errno = r.lookup(t, view, ".gitconfig")
	require.Equal(t, syscall.ENOENT, errno, "a fresh LOOKUP finds no regular file")
	o, errno := r.opendir(t, view)
	require.Zero(t, errno)
	require.Equal(t, []string{".", ".."}, names(r.listDir(t, view, o.Fh, opReaddir, 4096)))
	_, errno = r.setattr(t, held, setattrIn{Valid: fuse.FATTR_MODE, Mode: 0o666})
	require.Zero(t, errno)
	require.Equal(t, uint32(0o600), hostPerm(t, filepath.Join(h, "secret")), "chmod never reaches the link's target")

	// A directory in its place: the same.
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.Mkdir(path, 0o700))
	require.Equal(t, "SAVED by an editor, longer than before\n", open())
	require.NoError(t, os.Remove(path))
	save("back\n")
	require.Equal(t, "back\n", open())
	e, errno := r.lookup(t, view, ".gitconfig")
	require.Zero(t, errno)
	require.EqualValues(t, len("back\n"), e.Attr.Size)
	got, _ = os.ReadFile(filepath.Join(h, "secret"))
	require.Equal(t, "top secret", string(got))
}
