package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/blk/cow"
	vmbundle "github.com/cowork-vmm/cowork-vmm/helper/backend/vm/bundle"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/bundle"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// TestKVMBundleDirtyJournal: a bundle image whose ext4 journal needs
// recovery (the official helper was killed) boots, with what its journal
// holds there, and stays unchanged (issue #41). The dirty image is made
// by a real guest kernel: a guest on the stand-in bundle writes a file,
// syncs (the journal commits; the home blocks wait for writeback) and its
// helper is killed; the profile's layer is then folded into a copy of
// the image. A second helper boots a fresh profile on that copy.
// TestNestedKVMBundleDirtyJournal runs it where this KVM cannot boot
// Linux.
func TestKVMBundleDirtyJournal(t *testing.T) {
	backend := kvmBackend(t, "TestNestedKVMBundleDirtyJournal")
	b := bundle.Require(t)
	h := startHelper(t, backend)
	a := profilePipe(t, h.socket, "dirty-A")
	evA := subscribeProfile(t, h.socket, "dirty-A")
	bootBundle(t, a, "dirty-A", b.Dir)
	a.call("spawn", map[string]any{"id": "w", "name": "w", "command": "/bin/sh",
		"args": sh(`echo journalled | sudo tee /etc/cowork-journal-test >/dev/null && sync && echo synced`)}, nil)
	_, err := evA.tryWait("exit of w", 4*time.Minute, func(ev protocol.Event) bool { return ev.Type == protocol.EventExit && ev.ID == "w" })
	require.NoError(t, err)
	require.Equal(t, "synced\n", evA.output("stdout", "w"), "stderr %q", evA.output("stderr", "w"))
	require.NoError(t, h.cmd.Process.Kill()) // no shutdown: the journal is not checkpointed
	<-h.exited

	layers, err := filepath.Glob(filepath.Join(h.dataDir, "cowork-vmm", "profiles", "dirty-A-*", "bundle", "cowork-image-root.cow"))
	require.NoError(t, err)
	require.Len(t, layers, 1)
	dirty := t.TempDir()
	foldLayer(t, b.RootImagePath(), layers[0], filepath.Join(dirty, bundle.RootImage))
	copyFile(t, b.DataImagePath(), filepath.Join(dirty, bundle.DataImage))
	root := inspectRoot(t, filepath.Join(dirty, bundle.RootImage))
	require.True(t, root.FS.NeedsRecovery, "the folded image's journal needs recovery, as a killed guest's does")
	before := sha256File(t, filepath.Join(dirty, bundle.RootImage))

	h2 := startHelper(t, backend)
	c := profilePipe(t, h2.socket, "dirty-B")
	evB := subscribeProfile(t, h2.socket, "dirty-B")
	bootBundle(t, c, "dirty-B", dirty)
	c.call("spawn", map[string]any{"id": "r", "name": "w", "command": "/bin/sh", "args": sh(`cat /etc/cowork-journal-test`)}, nil)
	evB.exit("r")
	assert.Equal(t, "journalled\n", evB.output("stdout", "r"), "the journal's contents, replayed; stderr %q", evB.output("stderr", "r"))
	c.call("stopVM", nil, nil)
	assert.Contains(t, h2.stderr.String(), "journal needs recovery")
	assert.Equal(t, before, sha256File(t, filepath.Join(dirty, bundle.RootImage)), "the dirty image is never written")
	assert.True(t, inspectRoot(t, filepath.Join(dirty, bundle.RootImage)).FS.NeedsRecovery, "its journal was replayed into the layer only")
	recordBoot(t)
}

// inspectRoot reads the root volume of the image at path as the backend does.
func inspectRoot(t *testing.T, path string) vmbundle.Root {
	t.Helper()
	f, err := vmbundle.OpenImage(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := vmbundle.Inspect(f)
	require.NoError(t, err)
	root, err := vmbundle.SelectRoot(img)
	require.NoError(t, err)
	return root
}

// foldLayer writes to out the image at base with the root volume as the
// profile's copy-on-write layer at layer makes it read: chunks that differ
// from the image are written, the rest left sparse.
func foldLayer(t *testing.T, base, layer, out string) {
	t.Helper()
	root := inspectRoot(t, base)
	copyFile(t, base, out)
	bf, err := vmbundle.OpenImage(base)
	require.NoError(t, err)
	defer bf.Close()
	img, err := vmbundle.Inspect(bf)
	require.NoError(t, err)
	lf, err := os.OpenFile(layer, os.O_RDWR, 0)
	require.NoError(t, err)
	defer lf.Close()
	disk, err := cow.Open(cow.Base{File: bf, Offset: root.Offset(), Length: root.Length(),
		Identity: fmt.Sprintf("%s %s", img.Identity, root.Volume.Describe())}, lf)
	require.NoError(t, err)
	defer disk.Close()
	of, err := os.OpenFile(out, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer of.Close()
	const chunk = 1 << 20
	merged, orig := make([]byte, chunk), make([]byte, chunk)
	changed := 0
	for off := int64(0); off < root.Length(); off += chunk {
		n := min(chunk, root.Length()-off)
		_, err := disk.ReadV([][]byte{merged[:n]}, off)
		require.NoError(t, err)
		_, err = bf.ReadAt(orig[:n], root.Offset()+off)
		require.NoError(t, err)
		if !bytes.Equal(merged[:n], orig[:n]) {
			_, err = of.WriteAt(merged[:n], root.Offset()+off)
			require.NoError(t, err)
			changed++
		}
	}
	require.NoError(t, of.Sync())
	t.Logf("folded the layer into a copy of the image: %d MiB changed", changed)
}

// copyFile copies src to dst, sparse where src reads zeros.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	require.NoError(t, err)
	defer in.Close()
	st, err := in.Stat()
	require.NoError(t, err)
	out, err := os.Create(dst)
	require.NoError(t, err)
	defer out.Close()
	require.NoError(t, out.Truncate(st.Size()))
	buf, zero := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); ; {
		n, err := in.ReadAt(buf, off)
		if n > 0 && !bytes.Equal(buf[:n], zero[:n]) {
			_, werr := out.WriteAt(buf[:n], off)
			require.NoError(t, werr)
		}
		off += int64(n)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	require.NoError(t, out.Chmod(st.Mode().Perm()))
	require.NoError(t, os.Chtimes(dst, st.ModTime(), st.ModTime()))
}

// TestNestedKVMBundleDirtyJournal runs TestKVMBundleDirtyJournal inside
// the nested harness, like TestNestedKVMBundle.
func TestNestedKVMBundleDirtyJournal(t *testing.T) {
	b := bundle.Require(t)
	dir, err := filepath.EvalSymlinks(b.Dir)
	require.NoError(t, err)
	gt := nestedKVMTest(t, "^TestKVMBundleDirtyJournal$", 20*time.Minute, 1, bundle.DirEnv+"="+dir)
	gt.Shares = []string{dir}
	gt.MemMiB = 4096 // the dirty copy of the image lives in the outer guest's tmpfs
	nested.RunGoTestWith(t, gt)
}
