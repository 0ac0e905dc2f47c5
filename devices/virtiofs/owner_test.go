package virtiofs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// TestSetattrNeverGivesAFileAway: SETATTR naming a uid or gid other than
// the helper's own is EPERM, refused before anything reaches the host:
// the mode change the same request carries is not made, and a helper run
// as root (which the host would let chown) gives nothing away. Our own
// uid and gid work.
func TestSetattrNeverGivesAFileAway(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "x"})
	r.initSession(t)
	f := r.walk(t, "e1", "f")
	path := filepath.Join(dir, "f")
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	for name, in := range map[string]setattrIn{
		"uid":  {Valid: fuse.FATTR_MODE | fuse.FATTR_UID, Mode: 0o600, Uid: uid + 1000, Gid: gid},
		"gid":  {Valid: fuse.FATTR_MODE | fuse.FATTR_GID, Mode: 0o600, Uid: uid, Gid: gid + 1000},
		"both": {Valid: fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID, Mode: 0o600, Uid: 0xfffffffe, Gid: 0xfffffffe},
	} {
		_, errno := r.setattr(t, f, in)
		require.Equal(t, syscall.EPERM, errno, "SETATTR %s to another owner", name)
		var st syscall.Stat_t
		require.NoError(t, syscall.Stat(path, &st))
		require.Equal(t, uid, st.Uid, name)
		require.Equal(t, gid, st.Gid, name)
		require.Equal(t, uint32(0o644), st.Mode&0o7777, "%s: refused before the mode change reached the host", name)
	}
	a, errno := r.setattr(t, f, setattrIn{Valid: fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID, Mode: 0o600, Uid: uid, Gid: gid})
	require.Zero(t, errno, "our own uid and gid")
	require.Equal(t, uid, a.Uid)
	require.Equal(t, uint32(0o600), a.Mode&0o7777)
}
