package hostfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// split cuts p into buffers of n bytes (the last may be shorter).
func split(p []byte, n int) [][]byte {
	var iov [][]byte
	for len(p) > 0 {
		k := min(n, len(p))
		iov = append(iov, p[:k])
		p = p[k:]
	}
	return iov
}

// ReadvAt and WritevAt move every buffer in order, past one system call's
// 1024, stop at end of file, and keep WriteAt's rules: set-id bits
// cleared, a read-only export refused.
func TestVectoredReadAndWrite(t *testing.T) {
	h := newHarness(t)
	dir := h.export(t, "rw", false, map[string]string{"f": "0123456789"})
	roDir := h.export(t, "ro", true, map[string]string{"f": "0123456789"})
	require.NoError(t, os.Chmod(filepath.Join(dir, "f"), 0o755|os.ModeSetuid))

	f := directWalk(t, h.exports, "rw", "f")
	_, err := f.Open(unix.O_RDWR)
	require.NoError(t, err)
	vf := f
	data := make([]byte, 3*iovMax+5)
	for i := range data {
		data[i] = byte(i % 253)
	}
	n, err := vf.WritevAt(split(data, 3), 2)
	require.NoError(t, err)
	require.Equal(t, len(data), n)
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	require.NoError(t, err)
	require.Equal(t, append([]byte("01"), data...), got)
	assert.Equal(t, uint32(0o755), hostMode(t, filepath.Join(dir, "f")), "a write clears set-uid")

	back := make([]byte, len(data)+100)
	n, err = vf.ReadvAt(split(back, 2), 2)
	require.NoError(t, err)
	require.Equal(t, len(data), n, "short at end of file")
	require.Equal(t, data, back[:n])
	n, err = vf.ReadvAt(split(back, 2), int64(len(got)))
	require.NoError(t, err)
	require.Zero(t, n, "at end of file")
	_, err = vf.ReadvAt(split(back, 2), -1)
	require.Equal(t, unix.EINVAL, err)

	ro := directWalk(t, h.exports, "ro", "f")
	_, err = ro.Open(unix.O_RDONLY)
	require.NoError(t, err)
	_, err = ro.WritevAt([][]byte{[]byte("x")}, 0)
	require.Equal(t, unix.EROFS, err)
	got, err = os.ReadFile(filepath.Join(roDir, "f"))
	require.NoError(t, err)
	require.Equal(t, "0123456789", string(got), "the read-only export is unchanged")
}
