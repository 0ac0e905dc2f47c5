package virtiofs

import (
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// A guest may send FUSE_INIT again at any time (a new mount of the tag
// does, without a device reset; a hostile guest does it beside other
// requests). go-fuse's INIT rewrites the negotiated settings that the
// parsing of other requests reads (RENAME's and SETXATTR's argument
// sizes): INIT runs alone, so under -race this test fails without that.
func TestInitAgainBesideOtherRequests(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"a": "", "f": "x"})
	r.initSession(t)
	e1 := r.walk(t, "e1")
	f := r.walk(t, "e1", "f")
	type initIn struct {
		Major, Minor, MaxReadAhead, Flags, Flags2 uint32
		Unused                                    [11]uint32
	}
	q := r.drv.Queue(requestQueue)
	for range 20 {
		inits := map[uint64]bool{}
		for i := range 8 {
			var m []byte
			var unique uint64
			switch i % 4 {
			case 0:
				m, unique = r.encode(opInit, 0, &initIn{Major: 7, Minor: 36, Flags: uint32(fuse.CAP_READDIRPLUS)})
				inits[unique] = true
			case 1:
				m, _ = r.encode(opRename, e1, &renameIn{Newdir: e1}, cstr("a"), cstr("a"))
			case 2:
				m, _ = r.encode(opSetxattr, f, &struct{ Size, Flags uint32 }{1, 0}, cstr("user.x"), []byte("v"))
			default:
				m, _ = r.encode(opGetattr, f, &getattrIn{})
			}
			_, err := q.Add(virtiotest.Readable(m), virtiotest.Writable(4096))
			require.NoError(t, err)
		}
		q.Kick()
		used, err := q.WaitN(8, waitLimit)
		require.NoError(t, err)
		for _, u := range used {
			errno := errnoAt(t, u.Data)
			if inits[uniqueOf(u.Data)] {
				require.Zero(t, errno, "a repeated INIT is answered")
				continue
			}
			require.Contains(t, []syscall.Errno{0, syscall.ENOSYS}, errno)
		}
	}
	_, errno := r.getattr(t, f)
	require.Zero(t, errno, "the session goes on")
}
