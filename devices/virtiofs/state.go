package virtiofs

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// The device's own state across a VM snapshot (virtio.StateSaver): the
// guest kernel keeps its FUSE mount, so the restored device must know
// the FUSE_INIT it negotiated and the node ids the kernel holds. A node is
// saved by where it is (export name and path, hostfs.PathOf) and what it
// was (host device and inode): restored over a fresh Exports holding the
// same exports under the same names, each node is walked to again and
// kept only if it is still the same inode. One that is gone or replaced
// is left out, so the guest gets ESTALE for its id and looks its name up
// again; an export root that is gone or replaced fails the restore (the
// guest's mounts of it could not go on). Open handles are not saved: a
// session holding any refuses to be saved.

var _ virtio.StateSaver = (*Device)(nil)

// stateVersion is the version of the saved state's encoding; a state of
// another version is refused.
const stateVersion = 1

// maxStateBytes bounds the saved state, both ways: a table of
// DefaultMaxNodes nodes at a few dozen bytes of path each fits well.
const maxStateBytes = 32 << 20

// maxSavedID bounds the node and handle counters read back, far beyond
// any session's, so that counting on from them never wraps.
const maxSavedID = 1 << 62

// savedDevice is the state SaveDeviceState encodes (JSON).
type savedDevice struct {
	Version int
	Session *savedSession // nil: no session (inactive, or reset)
}

// savedSession is a session's state: the FUSE_INIT request go-fuse
// accepted (nil if none yet), the id counters, and the nodes the guest
// holds but the root.
type savedSession struct {
	Init       []byte
	NextNode   uint64
	NextHandle uint64
	Nodes      []savedNode
}

// savedNode is one node: its id and lookup count, its host file type and
// identity, and its place (hostfs.PathOf).
type savedNode struct {
	ID, Lookups uint64
	Mode        uint32 // S_IFMT bits
	Dev, Ino    uint64
	Export      string
	Path        []string
}

// restoredSession is a session rebuilt by RestoreDeviceState, which the
// next Activate goes on from.
type restoredSession struct {
	fs     *fileSystem
	server *fuse.ProtocolServer
	init   []byte
}

// SaveDeviceState implements virtio.StateSaver: the session's state, or
// "no session" while inactive. It fails while the guest holds an open
// file or directory (the caller then does not suspend).
func (d *Device) SaveDeviceState() ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.restored != nil {
		return nil, errors.New("virtio-fs: a restored session not yet activated cannot be saved")
	}
	saved := savedDevice{Version: stateVersion}
	if s := d.session; s != nil {
		s.initMu.RLock()
		init := s.init
		s.initMu.RUnlock()
		ss, err := s.fs.t.save()
		if err != nil {
			return nil, err
		}
		ss.Init = init
		saved.Session = ss
	}
	b, err := json.Marshal(saved)
	if err != nil {
		return nil, fmt.Errorf("virtio-fs: encoding the state: %w", err)
	}
	if len(b) > maxStateBytes {
		return nil, fmt.Errorf("virtio-fs: the state is %d bytes, at most %d", len(b), maxStateBytes)
	}
	return b, nil
}

// save returns the table's nodes and counters; an error when a handle is
// open. A node whose export was withdrawn is left out: it is ESTALE now
// and stays so.
func (t *table) save() (*savedSession, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.handles); n > 0 {
		return nil, fmt.Errorf("virtio-fs: the guest holds %d open files or directories; a session is saved only with none open", n)
	}
	ss := &savedSession{NextNode: t.nextNode, NextHandle: t.nextHandle}
	size := 0
	for id, n := range t.nodes {
		if id == fuse.FUSE_ROOT_ID {
			continue
		}
		export, path, err := hostfs.PathOf(n.file)
		if errors.Is(err, unix.ESTALE) || (err == nil && export == "") {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("virtio-fs: the place of node %d: %w", id, err)
		}
		for _, c := range path {
			size += len(c) + 3
		}
		if size > maxStateBytes {
			return nil, fmt.Errorf("virtio-fs: the nodes' paths pass %d bytes", maxStateBytes)
		}
		ss.Nodes = append(ss.Nodes, savedNode{
			ID: id, Lookups: n.lookups, Mode: n.mode, Dev: n.key.Dev, Ino: n.key.Ino, Export: export, Path: path,
		})
	}
	slices.SortFunc(ss.Nodes, func(a, b savedNode) int { return cmp.Compare(a.ID, b.ID) })
	return ss, nil
}

// RestoreDeviceState implements virtio.StateSaver: the next Activate goes
// on from the saved session, its nodes found again over the device's
// Root (see the top of this file). It fails for a state that does not
// parse or does not fit the device's limits, and for an export root the
// guest held that is gone or another directory now.
func (d *Device) RestoreDeviceState(state []byte) error {
	ss, err := decodeState(state, d.opts.MaxNodes)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.session != nil || d.restored != nil {
		return errors.New("virtio-fs: RestoreDeviceState needs a device never activated")
	}
	if ss == nil {
		return nil // no session: the next activation starts one, as today
	}
	t, err := d.rebuildTable(ss)
	if err != nil {
		return err
	}
	fsys := fileSystemOver(t, d.opts)
	server := d.newServer(fsys)
	if ss.Init != nil {
		if err := replayInit(server, ss.Init); err != nil {
			t.closeAll()
			return err
		}
	}
	d.restored = &restoredSession{fs: fsys, server: server, init: ss.Init}
	return nil
}

// decodeState parses and checks a saved state; nil for "no session".
func decodeState(state []byte, maxNodes int) (*savedSession, error) {
	if len(state) > maxStateBytes {
		return nil, fmt.Errorf("virtio-fs: a saved state of %d bytes, at most %d", len(state), maxStateBytes)
	}
	var saved savedDevice
	dec := json.NewDecoder(bytes.NewReader(state))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&saved); err != nil {
		return nil, fmt.Errorf("virtio-fs: the saved state does not parse: %w", err)
	}
	if saved.Version != stateVersion {
		return nil, fmt.Errorf("virtio-fs: a saved state of version %d, this device reads %d", saved.Version, stateVersion)
	}
	if saved.Session == nil {
		return nil, nil
	}
	if err := saved.Session.check(maxNodes); err != nil {
		return nil, fmt.Errorf("virtio-fs: bad saved state: %w", err)
	}
	return saved.Session, nil
}

// check validates a saved session against the table's limits.
func (ss *savedSession) check(maxNodes int) error {
	switch {
	case len(ss.Nodes) >= maxNodes:
		return fmt.Errorf("%d nodes, the table holds %d", len(ss.Nodes)+1, maxNodes)
	case ss.NextNode < fuse.FUSE_ROOT_ID || ss.NextNode > maxSavedID || ss.NextHandle > maxSavedID:
		return fmt.Errorf("id counters %d and %d", ss.NextNode, ss.NextHandle)
	case ss.Init != nil && (len(ss.Init) < 8 || len(ss.Init) > initRequestSize || opcodeOf([][]byte{ss.Init}) != fuseInit):
		return fmt.Errorf("a FUSE_INIT request of %d bytes", len(ss.Init))
	}
	seen := make(map[uint64]bool, len(ss.Nodes))
	for _, n := range ss.Nodes {
		if err := n.check(ss.NextNode); err != nil {
			return fmt.Errorf("node %d: %w", n.ID, err)
		}
		if seen[n.ID] {
			return fmt.Errorf("node %d twice", n.ID)
		}
		seen[n.ID] = true
	}
	return nil
}

// check validates one saved node: an id the session gave, a lookup, a
// file type, and names Walk would take.
func (n *savedNode) check(nextNode uint64) error {
	switch {
	case n.ID <= fuse.FUSE_ROOT_ID || n.ID > nextNode:
		return fmt.Errorf("an id out of the session's range (1, %d]", nextNode)
	case n.Lookups == 0:
		return errors.New("no lookup")
	case n.Mode == 0 || n.Mode&^syscall.S_IFMT != 0:
		return fmt.Errorf("file type %#o", n.Mode)
	case len(n.Path) > hostfs.MaxPathDepth:
		return fmt.Errorf("a path of %d components", len(n.Path))
	}
	if err := hostfs.CheckName(n.Export); err != nil {
		return fmt.Errorf("export name %q: %w", n.Export, err)
	}
	for _, c := range n.Path {
		if err := hostfs.CheckName(c); err != nil {
			return fmt.Errorf("path component %q: %w", c, err)
		}
	}
	return nil
}

// replayInit serves the saved FUSE_INIT to a restored session's server,
// so go-fuse's negotiated settings are those the guest kernel has; the
// reply is the guest's of long ago, and is dropped.
func replayInit(server *fuse.ProtocolServer, req []byte) error {
	reply := make([]byte, initReplySize)
	n, st := server.HandleRequest([][]byte{slices.Clone(req)}, [][]byte{reply})
	if !st.Ok() || !initAccepted(reply[:n]) {
		return errors.New("virtio-fs: the saved FUSE_INIT is refused")
	}
	return nil
}
