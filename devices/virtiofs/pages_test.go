package virtiofs

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// The guest's page cache sends a READ's room and a WRITE's data as one
// buffer per page, in an indirect table: 256 of them for 1 MiB. The data
// must arrive in order, whatever the split, and more buffers than one
// preadv or pwritev takes (1024) must not lose any.
func TestReadAndWriteOverOneBufferPerPage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		bufSize int
		bufs    int
	}{
		{"1 MiB in 4 KiB pages", 4096, 256},
		{"more buffers than one preadv takes", 100, 2500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Options{})
			size := tc.bufSize * tc.bufs
			content := make([]byte, size+777)
			for i := range content {
				content[i] = byte(i*7 + i/4096)
			}
			dir := r.export(t, "e1", false, map[string]string{"f": string(content)})
			r.initSession(t)
			f := r.walk(t, "e1", "f")
			fh, errno := r.open(t, f, syscall.O_RDWR)
			require.Zero(t, errno)

			msg, unique := r.encode(opRead, f, &readIn{Fh: fh, Offset: 5, Size: uint32(size)})
			bufs := []virtiotest.Buffer{virtiotest.Readable(msg), virtiotest.Writable(outHeaderSize)}
			for range tc.bufs {
				bufs = append(bufs, virtiotest.Writable(uint32(tc.bufSize)))
			}
			u := r.sendIndirect(t, bufs)
			require.Equal(t, unique, uniqueOf(u.Data))
			require.Zero(t, errnoAt(t, u.Data))
			require.EqualValues(t, outHeaderSize+size, u.Len)
			require.True(t, bytes.Equal(content[5:5+size], u.Data[outHeaderSize:]), "the pages hold the file's bytes in order")

			page := make([]byte, size)
			for i := range page {
				page[i] = byte(255 - i%251)
			}
			msg, unique = r.encode(opWrite, f, &writeIn{Fh: fh, Offset: 3, Size: uint32(size)})
			bufs = []virtiotest.Buffer{virtiotest.Readable(msg)}
			for i := range tc.bufs {
				bufs = append(bufs, virtiotest.Readable(page[i*tc.bufSize:(i+1)*tc.bufSize]))
			}
			u = r.sendIndirect(t, append(bufs, virtiotest.Writable(maxMessage)))
			require.Equal(t, unique, uniqueOf(u.Data))
			require.Zero(t, errnoAt(t, u.Data))
			got, err := os.ReadFile(filepath.Join(dir, "f"))
			require.NoError(t, err)
			want := append(append(append([]byte(nil), content[:3]...), page...), content[3+size:]...)
			require.True(t, bytes.Equal(want, got), "the host file holds every page, in order")
		})
	}
}

// sendIndirect sends bufs as one chain through an indirect table on the
// request queue and waits for its reply.
func (r *rig) sendIndirect(t testing.TB, bufs []virtiotest.Buffer) virtiotest.Used {
	t.Helper()
	dq := r.drv.Queue(requestQueue)
	_, err := dq.AddIndirect(bufs...)
	require.NoError(t, err)
	dq.Kick()
	u, err := dq.Wait(waitLimit)
	require.NoError(t, err)
	return u
}
