package virtiofs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// savedRig is a rig's device and transport state at a snapshot point,
// the old device reset (the VM is gone).
type savedRig struct {
	old    *rig
	opts   Options
	device []byte
	mmio   virtio.MMIOState
}

// saveRig saves r's device and transport, then resets the transport.
func saveRig(t *testing.T, r *rig, opts Options) savedRig {
	t.Helper()
	device, err := r.dev.SaveDeviceState()
	require.NoError(t, err)
	current := r.drv.Regs.(*virtio.MMIO) // the last restore's, not drv.MMIO()
	mmio, err := current.SaveState()
	require.NoError(t, err)
	current.Reset()
	return savedRig{old: r, opts: opts, device: device, mmio: mmio}
}

// restore makes a fresh device over fresh Exports holding the old rig's
// exports under the same names and host directories, gives it the saved
// state and activates it through a fresh transport over the same guest
// memory (the test driver goes on with its queues). The error is
// RestoreDeviceState's.
func (s savedRig) restore(t *testing.T) (*rig, error) {
	t.Helper()
	exports := hostfs.NewExports(discardLogger())
	for _, name := range s.old.exports.Names() {
		require.NoError(t, exports.Add(name, filepath.Join(s.old.dir, name), false))
	}
	opts := s.opts
	opts.Tag, opts.Root, opts.Logger = "cowork", exports, discardLogger()
	dev, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close(); exports.Close() })
	if err := dev.RestoreDeviceState(s.device); err != nil {
		return nil, err
	}
	transport := virtio.NewMMIO(dev, s.old.drv.Mem, s.old.drv.IRQ, virtio.MMIOOptions{Logger: discardLogger()})
	require.NoError(t, transport.RestoreState(s.mmio))
	require.NotZero(t, transport.Status()&virtio.StatusDriverOK)
	s.old.drv.Regs = transport
	r := &rig{dir: s.old.dir, exports: exports, dev: dev, drv: s.old.drv}
	r.unique.Store(s.old.unique.Load())
	return r, nil
}

// A session saved with the guest's nodes goes on in a fresh device over
// fresh Exports: the old node ids answer without a new INIT, a held name
// looked up again gives its old id, new nodes and handles get ids above
// every id the guest saw, and unknown ids are still ESTALE.
func TestSessionGoesOnAfterARestore(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"d/f.txt": "hello", "g.txt": "g"})
	r.initSession(t)
	e1, d := r.walk(t, "e1"), r.walk(t, "e1", "d")
	f := r.walk(t, "e1", "d", "f.txt")
	fh, errno := r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	r.release(t, f, fh, opRelease)

	restored, err := saveRig(t, r, Options{}).restore(t)
	require.NoError(t, err)
	nodes, handles := restored.dev.Counts()
	require.Equal(t, 4, nodes, "the root, e1, d and f.txt")
	require.Zero(t, handles)
	a, errno := restored.getattr(t, f)
	require.Zero(t, errno)
	require.EqualValues(t, 5, a.Size)
	fh2, errno := restored.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	require.Greater(t, fh2, fh, "handle ids are never given twice in a session")
	got, errno := restored.read(t, f, fh2, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "hello", string(got))
	restored.release(t, f, fh2, opRelease)

	again, errno := restored.lookup(t, d, "f.txt")
	require.Zero(t, errno)
	require.Equal(t, f, again.NodeId, "one node id per inode, across the restore")
	g, errno := restored.lookup(t, e1, "g.txt")
	require.Zero(t, errno)
	require.Greater(t, g.NodeId, f, "node ids are never given twice in a session")
	_, errno = restored.getattr(t, g.NodeId+100)
	require.Equal(t, syscall.ESTALE, errno)

	// The lookups counted before the snapshot are the guest's to forget.
	restored.forget(t, f, 1)
	_, errno = restored.getattr(t, f)
	require.Zero(t, errno, "f.txt was looked up twice")
	restored.forget(t, f, 1)
	_, errno = restored.getattr(t, f)
	require.Equal(t, syscall.ESTALE, errno)

	state, err := restored.dev.SaveDeviceState()
	require.NoError(t, err)
	var saved savedDevice
	require.NoError(t, json.Unmarshal(state, &saved))
	require.NotNil(t, saved.Session.Init, "the restored session knows its FUSE_INIT")
}

// A file the host replaced between the snapshot and the restore (a new
// inode at its name) is ESTALE under its old node id, and a lookup of its
// name finds the new file; a file edited in place keeps its node id and
// reads the new bytes.
func TestRestoreAfterTheHostChangedFiles(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"replaced": "old", "edited": "before"})
	r.initSession(t)
	e1 := r.walk(t, "e1")
	replaced, edited := r.walk(t, "e1", "replaced"), r.walk(t, "e1", "edited")
	saved := saveRig(t, r, Options{})

	require.NoError(t, os.WriteFile(filepath.Join(dir, "new"), []byte("the new one"), 0o644))
	require.NoError(t, os.Rename(filepath.Join(dir, "new"), filepath.Join(dir, "replaced")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "edited"), []byte("after!"), 0o644))
	restored, err := saved.restore(t)
	require.NoError(t, err)

	_, errno := restored.getattr(t, replaced)
	require.Equal(t, syscall.ESTALE, errno, "the replaced file's old node")
	e, errno := restored.lookup(t, e1, "replaced")
	require.Zero(t, errno)
	require.Greater(t, e.NodeId, edited, "a new node id")
	fh, errno := restored.open(t, e.NodeId, syscall.O_RDONLY)
	require.Zero(t, errno)
	got, errno := restored.read(t, e.NodeId, fh, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "the new one", string(got))

	fh, errno = restored.open(t, edited, syscall.O_RDONLY)
	require.Zero(t, errno)
	got, errno = restored.read(t, edited, fh, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "after!", string(got))
}

// An export root the guest holds that is another directory at the
// restore, or not registered again, fails the restore, naming the export.
func TestRestoreRefusesAChangedExportRoot(t *testing.T) {
	for _, removed := range []bool{false, true} {
		r := newRig(t, Options{})
		held := r.export(t, "held", false, map[string]string{"f": ""})
		r.export(t, "other", false, nil)
		r.initSession(t)
		r.walk(t, "held", "f")
		saved := saveRig(t, r, Options{})
		if removed {
			r.exports.Remove("held") // the backend registers what is there
		} else {
			require.NoError(t, os.RemoveAll(held))
			require.NoError(t, os.Mkdir(held, 0o755))
		}
		_, err := saved.restore(t)
		require.ErrorContains(t, err, `export "held"`, "removed %v", removed)
	}
}

// A session with an open file refuses to be saved (the guest would hold
// a handle the restored device does not have); once it is released, the
// session saves.
func TestSaveRefusesOpenHandles(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"f": "x"})
	r.initSession(t)
	f := r.walk(t, "e1", "f")
	fh, errno := r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	_, err := r.dev.SaveDeviceState()
	require.ErrorContains(t, err, "1 open files or directories")
	r.release(t, f, fh, opRelease)
	_, err = r.dev.SaveDeviceState()
	require.NoError(t, err)
}

// A device never activated (a first-boot snapshot is taken before the
// guest mounts anything) saves "no session", which restores into a
// device that starts a session at its guest's FUSE_INIT, as a new one.
func TestNoSessionStateRestoresAFreshDevice(t *testing.T) {
	exports := hostfs.NewExports(discardLogger())
	defer exports.Close()
	dev, err := New(Options{Tag: "t", Root: exports, Logger: discardLogger()})
	require.NoError(t, err)
	state, err := dev.SaveDeviceState()
	require.NoError(t, err)
	require.JSONEq(t, `{"Version":1,"Session":null}`, string(state))

	fresh, err := New(Options{Tag: "t", Root: exports, Logger: discardLogger()})
	require.NoError(t, err)
	defer fresh.Close()
	require.NoError(t, fresh.RestoreDeviceState(state))
	r := &rig{dir: t.TempDir(), exports: exports, dev: fresh}
	r.drv = virtiotest.Start(t, fresh, virtiotest.Options{MemSize: 64 << 20})
	r.export(t, "e1", false, map[string]string{"f": "x"})
	r.initSession(t)
	require.EqualValues(t, 2, r.walk(t, "e1"))
	require.ErrorContains(t, r.dev.RestoreDeviceState(state), "never activated")

	// Activated, no INIT yet: the restored session waits for it.
	r2 := newRig(t, Options{})
	r2.export(t, "e1", false, map[string]string{"f": "x"})
	restored, err := saveRig(t, r2, Options{}).restore(t)
	require.NoError(t, err)
	restored.initSession(t)
	require.EqualValues(t, 2, restored.walk(t, "e1"))
}

// A restored session's FUSE_INIT is replayed into the new protocol
// server: a saved INIT go-fuse refuses fails the restore.
func TestRestoreReplaysInit(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, nil)
	r.initSession(t)
	r.walk(t, "e1")
	saved := saveRig(t, r, Options{})
	var state savedDevice
	require.NoError(t, json.Unmarshal(saved.device, &state))
	require.Len(t, state.Session.Init, initRequestSize)
	state.Session.Init[40] = 6 // FUSE major version 6
	saved.device, _ = json.Marshal(state)
	_, err := saved.restore(t)
	require.ErrorContains(t, err, "FUSE_INIT is refused")
}

// The FUSE_INIT sizes the session copies are go-fuse's.
func TestInitSizes(t *testing.T) {
	require.EqualValues(t, unsafe.Sizeof(fuse.InitIn{}), initRequestSize)
	require.EqualValues(t, outHeaderSize+unsafe.Sizeof(fuse.InitOut{}), initReplySize)
}

// validState is a saved session holding e1 and e1/d/f of an exports
// whose e1 is dir, for the corrupt-state tests to spoil.
func validState(t testing.TB, exports *hostfs.Exports) (savedDevice, string) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "d", "f"), []byte("x"), 0o644))
	require.NoError(t, exports.Add("e1", dir, false))
	var root, f syscall.Stat_t
	require.NoError(t, syscall.Stat(dir, &root))
	require.NoError(t, syscall.Stat(filepath.Join(dir, "d", "f"), &f))
	init := make([]byte, initRequestSize)
	copy(init, []byte{104, 0, 0, 0, fuseInit, 0, 0, 0})
	copy(init[40:], []byte{7, 0, 0, 0, 36, 0, 0, 0})
	return savedDevice{Version: stateVersion, Session: &savedSession{
		Init: init, NextNode: 3,
		Nodes: []savedNode{
			{ID: 2, Lookups: 1, Mode: syscall.S_IFDIR, Dev: root.Dev, Ino: root.Ino, Export: "e1"},
			{ID: 3, Lookups: 2, Mode: syscall.S_IFREG, Dev: f.Dev, Ino: f.Ino, Export: "e1", Path: []string{"d", "f"}},
		},
	}}, dir
}

// A saved state that does not parse or does not fit is refused with an
// error, never a panic, and leaves the device as new.
func TestCorruptStatesAreRefused(t *testing.T) {
	exports := hostfs.NewExports(discardLogger())
	defer exports.Close()
	good, _ := validState(t, exports)
	spoil := func(change func(s *savedSession)) string {
		b, _ := json.Marshal(good)
		var s savedDevice
		require.NoError(t, json.Unmarshal(b, &s))
		change(s.Session)
		b, _ = json.Marshal(s)
		return string(b)
	}
	deep := make([]string, hostfs.MaxPathDepth+1)
	for i := range deep {
		deep[i] = "d"
	}
	for name, state := range map[string]string{
		"empty":          "",
		"not json":       "{",
		"null":           "null",
		"version":        `{"Version":2,"Session":null}`,
		"unknown field":  `{"Version":1,"Session":null,"Handles":[1]}`,
		"too many nodes": spoil(func(s *savedSession) { s.Nodes = append(s.Nodes, s.Nodes[0], s.Nodes[0], s.Nodes[0]) }),
		"root id":        spoil(func(s *savedSession) { s.Nodes[0].ID = 1 }),
		"id past next":   spoil(func(s *savedSession) { s.Nodes[0].ID = 4 }),
		"id twice":       spoil(func(s *savedSession) { s.Nodes[1].ID = 2 }),
		"no lookup":      spoil(func(s *savedSession) { s.Nodes[0].Lookups = 0 }),
		"no file type":   spoil(func(s *savedSession) { s.Nodes[0].Mode = 0 }),
		"mode bits":      spoil(func(s *savedSession) { s.Nodes[0].Mode = syscall.S_IFDIR | 0o755 }),
		"export name":    spoil(func(s *savedSession) { s.Nodes[0].Export = ".." }),
		"no export":      spoil(func(s *savedSession) { s.Nodes[1].Export = "" }),
		"component":      spoil(func(s *savedSession) { s.Nodes[1].Path = []string{"d/f"} }),
		"dot dot":        spoil(func(s *savedSession) { s.Nodes[1].Path = []string{"..", "f"} }),
		"too deep":       spoil(func(s *savedSession) { s.Nodes[1].Path = deep }),
		"init short":     spoil(func(s *savedSession) { s.Init = s.Init[:4] }),
		"init long":      spoil(func(s *savedSession) { s.Init = append(s.Init, 0) }),
		"init opcode":    spoil(func(s *savedSession) { s.Init[4] = opLookup }),
		"next node":      spoil(func(s *savedSession) { s.NextNode = 1 << 63 }),
		"next handle":    spoil(func(s *savedSession) { s.NextHandle = 1 << 63 }),
	} {
		dev, err := New(Options{Tag: "t", Root: exports, Logger: discardLogger(), MaxNodes: 4})
		require.NoError(t, err)
		require.Error(t, dev.RestoreDeviceState([]byte(state)), name)
		require.Nil(t, dev.restored, name)
		dev.Close()
	}
	dev, err := New(Options{Tag: "t", Root: exports, Logger: discardLogger(), MaxNodes: 4})
	require.NoError(t, err)
	require.NoError(t, dev.RestoreDeviceState([]byte(spoil(func(*savedSession) {}))), "the unspoiled state")
	require.Len(t, dev.restored.fs.t.nodes, 3)
	_, err = dev.SaveDeviceState()
	require.ErrorContains(t, err, "not yet activated", "a pending session is not lost")
	dev.Close()
}

// Whatever the bytes, RestoreDeviceState answers with an error or a
// restored session, never a panic.
func FuzzRestoreDeviceState(f *testing.F) {
	exports := hostfs.NewExports(discardLogger())
	f.Cleanup(exports.Close)
	good, _ := validState(f, exports)
	b, err := json.Marshal(good)
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte(`{"Version":1,"Session":null}`))
	f.Add([]byte(`{"Version":1,"Session":{"NextNode":5,"Nodes":[{"ID":5,"Lookups":1,"Mode":16384,"Export":"e1","Path":["d"]}]}}`))
	f.Fuzz(func(t *testing.T, state []byte) {
		dev, err := New(Options{Tag: "t", Root: exports, Logger: discardLogger(), MaxNodes: 64})
		require.NoError(t, err)
		_ = dev.RestoreDeviceState(state)
		dev.Close()
	})
}

// A NoOpen device's restored nodes read by node, as before the snapshot:
// the reader a node kept is not saved, and the first READ opens another.
func TestNoOpenNodesReadAfterARestore(t *testing.T) {
	opts := Options{Cached: true, NoOpen: true, ListNamesOnly: true}
	r := newRig(t, opts)
	r.export(t, "e1", false, map[string]string{"bin/tool": "#!/bin/true"})
	r.initSession(t)
	bin, tool := r.walk(t, "e1", "bin"), r.walk(t, "e1", "bin", "tool")
	got, errno := r.read(t, tool, 0, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "#!/bin/true", string(got))

	restored, err := saveRig(t, r, opts).restore(t)
	require.NoError(t, err)
	got, errno = restored.read(t, tool, 0, 2, 100)
	require.Zero(t, errno)
	require.Equal(t, "/bin/true", string(got))
	e, errno := restored.lookup(t, bin, "missing")
	require.Zero(t, errno, "a cached device's negative entry")
	require.Zero(t, e.NodeId)
}
