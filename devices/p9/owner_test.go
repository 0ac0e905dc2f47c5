package p9

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/require"
)

// TestSetattrNeverGivesAFileAway: Tsetattr naming a uid or gid other than
// the helper's own is EPERM, refused before anything reaches the host
// (the mode change it carries is not made; a helper run as root would
// otherwise chown). Our own uid and gid work.
func TestSetattrNeverGivesAFileAway(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "x"})
	c := r.client(t)
	root, err := c.Attach("e1")
	require.NoError(t, err)
	defer root.Close()
	f := clientWalk(t, root, "f")
	path := filepath.Join(dir, "f")
	uid, gid := p9lib.UID(os.Geteuid()), p9lib.GID(os.Getegid())
	for name, attr := range map[string]struct {
		valid p9lib.SetAttrMask
		attr  p9lib.SetAttr
	}{
		"uid": {p9lib.SetAttrMask{Permissions: true, UID: true}, p9lib.SetAttr{Permissions: 0o600, UID: uid + 1000}},
		"gid": {p9lib.SetAttrMask{Permissions: true, GID: true}, p9lib.SetAttr{Permissions: 0o600, GID: gid + 1000}},
	} {
		err := f.SetAttr(attr.valid, attr.attr)
		require.ErrorIs(t, err, linux.EPERM, "Tsetattr %s to another owner", name)
		var st syscall.Stat_t
		require.NoError(t, syscall.Stat(path, &st))
		require.Equal(t, uint32(uid), st.Uid, name)
		require.Equal(t, uint32(gid), st.Gid, name)
		require.Equal(t, uint32(0o644), st.Mode&0o7777, "%s: refused before the mode change reached the host", name)
	}
	require.NoError(t, f.SetAttr(p9lib.SetAttrMask{Permissions: true, UID: true, GID: true},
		p9lib.SetAttr{Permissions: 0o600, UID: uid, GID: gid}), "our own uid and gid")
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	require.Equal(t, uint32(0o600), st.Mode&0o7777)
}
