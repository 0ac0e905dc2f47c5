package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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
	before := sparseDigest(t, filepath.Join(dirty, bundle.RootImage))

	h2 := startHelper(t, backend)
	c := profilePipe(t, h2.socket, "dirty-B")
	evB := subscribeProfile(t, h2.socket, "dirty-B")
	bootBundle(t, c, "dirty-B", dirty)
	c.call("spawn", map[string]any{"id": "r", "name": "w", "command": "/bin/sh", "args": sh(`cat /etc/cowork-journal-test`)}, nil)
	evB.exit("r")
	assert.Equal(t, "journalled\n", evB.output("stdout", "r"), "the journal's contents, replayed; stderr %q", evB.output("stderr", "r"))
	c.call("stopVM", nil, nil)
	assert.Contains(t, h2.stderr.String(), "journal needs recovery")
	assert.Equal(t, before, sparseDigest(t, filepath.Join(dirty, bundle.RootImage)), "the dirty image is never written")
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

// foldLayer writes to out a copy of the image at base with the root
// volume as the profile's copy-on-write layer at layer makes it read: the
// clusters the layer holds data for (its data region's extents, SEEK_DATA)
// are read through the layer and written to the copy. Discarded clusters
// are not carried over; the guest mounts without discard.
func foldLayer(t *testing.T, base, layer, out string) {
	t.Helper()
	copyFile(t, base, out)
	bf, err := vmbundle.OpenImage(base)
	require.NoError(t, err)
	defer bf.Close()
	img, err := vmbundle.Inspect(bf)
	require.NoError(t, err)
	root, err := vmbundle.SelectRoot(img)
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
	dataStart := layerDataOffset(root.Length())
	folded := int64(0)
	for _, ext := range dataExtents(t, lf) {
		from, to := max(ext[0], dataStart)-dataStart, min(ext[1]-dataStart, root.Length())
		if to <= from {
			continue
		}
		buf := make([]byte, to-from)
		_, err := disk.ReadV([][]byte{buf}, from)
		require.NoError(t, err)
		_, err = of.WriteAt(buf, root.Offset()+from)
		require.NoError(t, err)
		folded += to - from
	}
	require.NoError(t, of.Sync())
	t.Logf("folded the layer into a copy of the image: %d KiB", folded>>10)
}

// layerDataOffset is where a cow layer's data region begins for a base of
// length bytes (devices/blk/cow's doc.go): two map slots, each a 320-byte
// header and 2 bits a cluster rounded up to 4 KiB, rounded up to a cluster.
func layerDataOffset(length int64) int64 {
	const cluster = cow.ClusterSize
	clusters := (length + cluster - 1) / cluster
	slot := (320 + (clusters+3)/4 + 4095) &^ 4095
	return (2*slot + cluster - 1) &^ (cluster - 1)
}

// dataExtents lists the [start, end) ranges of f that hold data.
func dataExtents(t *testing.T, f *os.File) [][2]int64 {
	t.Helper()
	st, err := f.Stat()
	require.NoError(t, err)
	var out [][2]int64
	for off := int64(0); off < st.Size(); {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		require.NoError(t, err)
		end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
		require.NoError(t, err)
		out = append(out, [2]int64{start, end})
		off = end
	}
	return out
}

// copyFile copies src to dst, keeping its mode and mtime: only its data
// extents are read (a file system without SEEK_DATA reports one), and
// what reads as zeros is left a hole.
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
	for _, ext := range dataExtents(t, in) {
		for off := ext[0]; off < ext[1]; {
			n, err := in.ReadAt(buf[:min(int64(len(buf)), ext[1]-off)], off)
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
	}
	require.NoError(t, out.Chmod(st.Mode().Perm()))
	require.NoError(t, os.Chtimes(dst, st.ModTime(), st.ModTime()))
}

// sparseDigest is a SHA-256 of the file at path as its data extents and
// their bytes: any write to it changes it, and holes cost nothing to read.
func sparseDigest(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	for _, ext := range dataExtents(t, f) {
		fmt.Fprintf(h, "%d-%d:", ext[0], ext[1])
		_, err := io.Copy(h, io.NewSectionReader(f, ext[0], ext[1]-ext[0]))
		require.NoError(t, err)
	}
	return hex.EncodeToString(h.Sum(nil))
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
