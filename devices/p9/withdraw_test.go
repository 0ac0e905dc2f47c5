package p9

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const msgRreaddir = 41

// Issue #15 defect 4: Treaddir's count went to the server unclamped, so a
// guest asking for 4 GiB made it build a reply far beyond msize. The
// device clamps count to what fits the negotiated msize.
func TestTreaddirCountIsClampedToMsize(t *testing.T) {
	r := newRig(t, Options{})
	files := map[string]string{}
	for i := range 400 { // ~25 KB of entries, three times the msize
		files[fmt.Sprintf("a-file-with-a-rather-long-name-%04d", i)] = ""
	}
	r.export(t, "s", false, files)
	const msize = 8192
	version(t, r, msize)
	rt := func(msg []byte, writable uint32) []byte { return r.roundTrip(t, msg, writable).Data }
	typ, _, _ := replyOf(t, rt(message(msgTattach, 1, cat(le32(1), le32(noFid), str9(""), str9("s"), le32(0))), 4096))
	require.Equal(t, uint8(105), typ)
	typ, _, _ = replyOf(t, rt(message(msgTlopen, 2, cat(le32(1), le32(unix.O_RDONLY))), 4096))
	require.Equal(t, uint8(13), typ, "Rlopen")

	seen := 0
	offset := uint64(0)
	for range 20 {
		data := rt(message(msgTreaddir, 3, cat(le32(1), le64(offset), le32(0xFFFF_FFFF))), msize)
		typ, tag, body := replyOf(t, data)
		require.Equal(t, uint8(msgRreaddir), typ, "an Rreaddir within msize, not EMSGSIZE")
		assert.Equal(t, uint16(3), tag)
		assert.LessOrEqual(t, len(data), msize)
		count := binary.LittleEndian.Uint32(body)
		require.Equal(t, int(count), len(body)-4)
		if count == 0 {
			break
		}
		// Walk the entries: qid[13] offset[8] type[1] name[s].
		for b := body[4:]; len(b) > 0; {
			offset = binary.LittleEndian.Uint64(b[13:21])
			n := int(binary.LittleEndian.Uint16(b[22:24]))
			if name := string(b[24 : 24+n]); name != "." && name != ".." {
				seen++
			}
			b = b[24+n:]
		}
	}
	assert.Equal(t, len(files), seen, "the whole directory, page by page")
}

// Issue #15 defect 3 through the device: after a mount is replaced rw →
// ro, the old export cannot be attached, the guest's held fids fail, and
// the host descriptors are gone before the guest clunks anything.
func TestRemovedExportIsRevokedThroughTheDevice(t *testing.T) {
	r := newRig(t, Options{})
	c := r.client(t)
	fdsBefore := countFds(t)
	dir := r.export(t, "rw", false, map[string]string{"f": "data"})
	root, err := c.Attach("rw")
	require.NoError(t, err)
	defer root.Close()
	f := clientWalk(t, root, "f")
	_, _, err = f.Open(p9lib.ReadWrite)
	require.NoError(t, err)

	require.NoError(t, r.exports.Add("ro", dir, true))
	r.exports.Remove("rw")
	assert.Equal(t, fdsBefore+1, countFds(t), "only the new export's directory is open")
	_, err = f.WriteAt([]byte("DATA"), 0)
	assert.ErrorIs(t, err, linux.ESTALE)
	_, err = c.Attach("rw")
	assert.ErrorIs(t, err, linux.ENOENT)
	b, _ := os.ReadFile(filepath.Join(dir, "f"))
	assert.Equal(t, "data", string(b))

	ro, err := c.Attach("ro")
	require.NoError(t, err)
	defer ro.Close()
	g := clientWalk(t, ro, "f")
	_, _, err = g.Open(p9lib.ReadWrite)
	assert.ErrorIs(t, err, linux.EROFS)
}

// Issue #15 defect 2 through the device: a single-file export of
// ~/.gitconfig reaches that file only.
func TestFileExportThroughTheDevice(t *testing.T) {
	r := newRig(t, Options{})
	home := r.export(t, "home-not-exported", false, map[string]string{".gitconfig": "[user]", "secret": "s"})
	r.exports.Remove("home-not-exported")
	require.NoError(t, r.exports.AddFile("gc", filepath.Join(home, ".gitconfig"), false))
	c := r.client(t)
	root, err := c.Attach("gc")
	require.NoError(t, err)
	defer root.Close()
	_, _, err = root.Walk([]string{"secret"})
	assert.ErrorIs(t, err, linux.ENOENT)
	_, err = root.Mkdir("planted", 0o755, p9lib.NoUID, p9lib.NoGID)
	assert.ErrorIs(t, err, linux.EPERM)
	f := clientWalk(t, root, ".gitconfig")
	_, _, err = f.Open(p9lib.ReadOnly)
	require.NoError(t, err)
	assert.Equal(t, "[user]", readAt(t, f, 100))
}

func countFds(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents) - 1
}
