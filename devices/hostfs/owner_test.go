package hostfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs/hostfstest"
)

// TestShowOwnedAs: an export made with ShowOwnedAs reports what the
// helper owns — files there before, files the guest creates — as the
// given owner, anyone else's as they are, and takes a chown to the shown
// owner as one to the helper's own; other exports report the host's ids.
func TestShowOwnedAs(t *testing.T) {
	h := newHarness(t)
	session := Owner{UID: 100003, GID: 100003}
	dir := filepath.Join(h.base, "session")
	hostfstest.WriteTree(t, dir, map[string]string{"mine.txt": "m", "theirs.txt": "t"})
	other := os.Geteuid() == 0 // only root can give a file to someone else
	if other {
		require.NoError(t, os.Lchown(filepath.Join(dir, "theirs.txt"), 4242, 4343))
	}
	require.NoError(t, h.exports.Add("session", dir, false, ShowOwnedAs(session)))
	h.export(t, "plain", false, map[string]string{"mine.txt": "m"})

	root := h.attach(t, "session")
	rootAttr, err := root.Stat()
	require.NoError(t, err)
	assert.Equal(t, session.UID, rootAttr.Stat.Uid, "the export's own directory")
	assert.Equal(t, session.GID, rootAttr.Stat.Gid)

	_, mine, err := root.Walk("mine.txt")
	require.NoError(t, err)
	assert.Equal(t, [2]uint32{session.UID, session.GID}, [2]uint32{mine.Stat.Uid, mine.Stat.Gid}, "a file the helper owns")
	if other {
		_, theirs, err := root.Walk("theirs.txt")
		require.NoError(t, err)
		assert.Equal(t, [2]uint32{4242, 4343}, [2]uint32{theirs.Stat.Uid, theirs.Stat.Gid}, "another user's file")
	}
	made, err := root.Mkdir("made", 0o700)
	require.NoError(t, err)
	assert.Equal(t, session.UID, made.Stat.Uid, "what the guest creates is shown as the session's")

	node := walk(t, root, "mine.txt")
	require.NoError(t, node.SetAttr(SetAttr{Valid: SetUID | SetGID, UID: session.UID, GID: session.GID}), "chown to the shown owner")
	var st unix.Stat_t
	require.NoError(t, unix.Lstat(filepath.Join(dir, "mine.txt"), &st))
	assert.Equal(t, uint32(os.Geteuid()), st.Uid, "the host file stays the helper's")
	assert.ErrorIs(t, node.SetAttr(SetAttr{Valid: SetUID, UID: 4242}), unix.EPERM, "chown to anyone else")

	_, plainAttr, err := h.attach(t, "plain").Walk("mine.txt")
	require.NoError(t, err)
	assert.Equal(t, uint32(os.Geteuid()), plainAttr.Stat.Uid, "an export without ShowOwnedAs shows the host's owner")
}
