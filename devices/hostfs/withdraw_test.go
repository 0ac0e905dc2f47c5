package hostfs

import (
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openFds counts this process's open descriptors.
func openFds(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents) - 1 // the directory ReadDir had open
}

// Issue #15 defect 3: a mount replaced rw → ro left the old export
// attachable, and writable through the fids the guest held. Remove now
// revokes them at once and closes every descriptor.
func TestRemoveRevokesHeldFidsAndClosesDescriptors(t *testing.T) {
	h := newHarness(t)
	fdsBefore := openFds(t)
	dir := h.export(t, "rw", false, map[string]string{"f.txt": "data", "sub/g.txt": "more"})
	root := h.attach(t, "rw")

	// The guest holds a spread of fids: open for writing, open directory,
	// walked but unopened, a clone of the root, a deep one.
	w := walk(t, root, "f.txt")
	_, err := w.Open(unix.O_RDWR)
	require.NoError(t, err)
	d := walk(t, root)
	_, err = d.Open(unix.O_RDONLY)
	require.NoError(t, err)
	_, err = d.Readdir(0, 4096)
	require.NoError(t, err)
	sub := walk(t, root, "sub")
	deep := walk(t, sub, "g.txt")
	_, err = deep.Open(unix.O_RDONLY)
	require.NoError(t, err)
	assert.Greater(t, openFds(t), fdsBefore+5, "the fids hold host descriptors")

	// The mount is replaced read-only: a new export, the old one removed.
	require.NoError(t, h.exports.Add("ro", dir, true))
	h.exports.Remove("rw")
	assert.Equal(t, fdsBefore+1, openFds(t), "every descriptor of the removed export closed before the guest clunks")

	_, _, err = h.exports.Root().Walk("rw")
	assert.Error(t, err, "the old export is not attachable")
	_, err = writeAt(w, []byte("DATA"), 0)
	assert.ErrorIs(t, err, unix.ESTALE, "write through a held fid")
	ops := map[string]func() error{
		"read":     func() error { _, err := readAt(deep, make([]byte, 4), 0); return err },
		"readdir":  func() error { _, err := d.Readdir(0, 4096); return err },
		"walk":     func() error { _, _, err := sub.Walk("g.txt"); return err },
		"clone":    func() error { _, err := root.Clone(); return err },
		"getattr":  func() error { _, err := sub.Stat(); return err },
		"setattr":  func() error { return w.SetAttr(SetAttr{Valid: SetSize, Size: 0}) },
		"create":   func() error { _, _, err := sub.Create("new", unix.O_RDWR, 0o644); return err },
		"mkdir":    func() error { _, err := root.Mkdir("new", 0o755); return err },
		"unlinkat": func() error { return root.UnlinkAt("f.txt", 0) },
		"renameat": func() error { return root.RenameAt("f.txt", sub, "moved") },
		"fsync":    func() error { return w.Sync() },
		"statfs":   func() error { _, err := root.StatFS(); return err },
	}
	for name, op := range ops {
		assert.ErrorIs(t, op(), unix.ESTALE, name)
	}
	b, err := os.ReadFile(filepath.Join(dir, "f.txt"))
	require.NoError(t, err)
	assert.Equal(t, "data", string(b), "nothing reached the host after the removal")
	assert.FileExists(t, filepath.Join(dir, "sub", "g.txt"))

	// The new, read-only export works and refuses writes.
	ro := h.attach(t, "ro")
	f := walk(t, ro, "f.txt")
	_, err = f.Open(unix.O_RDWR)
	assert.ErrorIs(t, err, unix.EROFS)
	_, err = f.Open(unix.O_RDONLY)
	require.NoError(t, err)
	assert.Equal(t, "data", readAll(t, f))

	// Clunking the revoked fids later closes nothing twice.
	for _, fid := range []Node{w, d, deep, sub} {
		require.NoError(t, fid.Close())
	}
	require.NoError(t, f.Close())
	h.exports.Remove("ro")
	assert.Equal(t, fdsBefore, openFds(t), "no descriptor leaked")
}

// Revocation while the guest keeps operating: no operation uses a closed
// (and perhaps reused) descriptor, and everything ends in ESTALE.
func TestRemoveDuringOperations(t *testing.T) {
	h := newHarness(t)
	fdsBefore := openFds(t)
	h.export(t, "busy", false, map[string]string{"f": "0123456789"})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 8 {
		root := directWalk(t, h.exports, "busy")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				f, _, err := root.Walk("f")
				if err != nil {
					assert.ErrorIs(t, err, unix.ESTALE)
					return
				}
				if _, err := f.Open(unix.O_RDWR); err == nil {
					_, err = writeAt(f, []byte("x"), 0)
					if err != nil {
						assert.ErrorIs(t, err, unix.ESTALE)
					}
					if _, err := readAt(f, make([]byte, 10), 0); err != nil && err != io.EOF {
						assert.ErrorIs(t, err, unix.ESTALE)
					}
				}
				_ = f.Close()
			}
		}()
	}
	h.exports.Remove("busy")
	close(stop)
	wg.Wait()
	assert.Equal(t, fdsBefore, openFds(t), "descriptors closed")
}

// Tclunk of a file of a removed export, and Remove of an export whose
// files were all clunked, both leave the descriptor count where it was.
func TestRemoveAfterClunksLeaksNothing(t *testing.T) {
	h := newHarness(t)
	fdsBefore := openFds(t)
	h.export(t, "x", false, map[string]string{"f": "f"})
	root := directWalk(t, h.exports, "x")
	f, _, err := root.Walk("f")
	require.NoError(t, err)
	_, err = f.Open(unix.O_RDONLY)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	h.exports.Remove("x")
	assert.Equal(t, fdsBefore, openFds(t))
	_, err = root.StatFS()
	assert.ErrorIs(t, err, unix.ESTALE)
}
