package hostfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// hostMode is the permission bits (with set-ID and sticky bits) of a host
// path.
func hostMode(t *testing.T, path string) uint32 {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Lstat(path, &st))
	return st.Mode & 0o7777
}

// Issue #15 defect 5: set-user-ID and set-group-ID bits from the guest
// survived on the host. Each operation that sets a mode drops them, and a
// write clears those a host file has. (hugelgupf/p9 v0.3.0 already masks
// the permissions it decodes from Tlcreate, Tmkdir and Tsetattr, but the
// layer must not depend on a server doing so: these Nodes get the bits.)
func TestSetIDBitsNeverReachTheHost(t *testing.T) {
	h := newHarness(t)
	dir := h.export(t, "rw", false, map[string]string{"plain": "x"})
	root := directWalk(t, h.exports, "rw")

	clone, err := root.Clone()
	require.NoError(t, err)
	nf, _, err := clone.Create("created", unix.O_RDWR, 0o6755)
	require.NoError(t, err)
	require.NoError(t, clone.Close())
	require.NoError(t, nf.Close())
	assert.Equal(t, uint32(0o755), hostMode(t, filepath.Join(dir, "created")), "Tlcreate")

	_, err = root.Mkdir("made", 0o3755) // set-gid and sticky
	require.NoError(t, err)
	assert.Equal(t, uint32(0o1755), hostMode(t, filepath.Join(dir, "made")), "Tmkdir keeps the sticky bit, drops set-gid")

	_, err = root.Mknod("node", uint32(unix.S_IFREG|0o6755))
	require.NoError(t, err)
	assert.Equal(t, uint32(0o755), hostMode(t, filepath.Join(dir, "node")), "Tmknod")

	plain := directWalk(t, h.exports, "rw", "plain")
	require.NoError(t, plain.SetAttr(SetAttr{Valid: SetMode, Mode: 0o6755}))
	assert.Equal(t, uint32(0o755), hostMode(t, filepath.Join(dir, "plain")), "Tsetattr mode")
}

func TestWriteAndTruncateClearSetIDBits(t *testing.T) {
	h := newHarness(t)
	dir := h.export(t, "rw", false, map[string]string{"suid": "#!", "sgid": "#!", "sgid-noexec": "#!", "trunc": "#!", "otrunc": "#!"})
	for name, mode := range map[string]os.FileMode{
		"suid": 0o755 | os.ModeSetuid, "sgid": 0o755 | os.ModeSetgid, "sgid-noexec": 0o644 | os.ModeSetgid,
		"trunc": 0o755 | os.ModeSetuid | os.ModeSetgid, "otrunc": 0o755 | os.ModeSetuid,
	} {
		require.NoError(t, os.Chmod(filepath.Join(dir, name), mode))
	}
	root := h.attach(t, "rw")

	for _, name := range []string{"suid", "sgid", "sgid-noexec"} {
		f := walk(t, root, name)
		_, err := f.Open(unix.O_WRONLY)
		require.NoError(t, err)
		_, err = writeAt(f, []byte("#!/bin/sh\n"), 0)
		require.NoError(t, err)
	}
	assert.Equal(t, uint32(0o755), hostMode(t, filepath.Join(dir, "suid")), "write clears set-uid")
	assert.Equal(t, uint32(0o755), hostMode(t, filepath.Join(dir, "sgid")), "write clears set-gid of a group-executable file")
	assert.Equal(t, uint32(0o2644), hostMode(t, filepath.Join(dir, "sgid-noexec")),
		"set-gid without group execute is no privilege (Linux keeps it too)")

	require.NoError(t, walk(t, root, "trunc").SetAttr(SetAttr{Valid: SetSize, Size: 0}))
	assert.Equal(t, uint32(0o755), hostMode(t, filepath.Join(dir, "trunc")), "truncate clears both")
	_, err := walk(t, root, "otrunc").Open(unix.O_WRONLY | unix.O_TRUNC)
	require.NoError(t, err)
	assert.Equal(t, uint32(0o755), hostMode(t, filepath.Join(dir, "otrunc")), "open with O_TRUNC clears set-uid")
}
