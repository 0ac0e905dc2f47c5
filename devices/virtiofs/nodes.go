package virtiofs

import (
	"syscall"

	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
)

// node is one inode the guest kernel holds: a file of the export layer
// (an O_PATH descriptor on the host) and the guest's lookup count, which
// FORGET lowers. The guest learns it as a node id.
type node struct {
	file    hostfs.Node
	key     hostfs.Key
	mode    uint32 // the host file type bits (S_IFMT), stable for an inode
	lookups uint64
	use     // guarded by table.mu
	// reader is the file opened for reading by the READs of a device
	// whose guest opens files without asking (see fileSystem.Open), from
	// the first such READ until the node closes; nil before. Guarded by
	// table.mu; counted in table.readers.
	reader hostfs.Node
}

// close closes the node's files (its last user, out of the table).
func (n *node) close() {
	_ = n.file.Close()
	if n.reader != nil {
		_ = n.reader.Close()
	}
}

// handle is one open file or directory (an open descriptor on the host).
type handle struct {
	file hostfs.Node
	dir  bool
	use  // guarded by table.mu
}

// use counts the requests using a node's or handle's file. A hostile
// guest may FORGET a node or RELEASE a handle while another of its
// requests still uses it: the entry leaves the table at once (new requests
// get ESTALE or EBADF), but its file is closed by the last user, never
// under a running pread, pwrite or mkdirat, whose descriptor number the
// host could otherwise reuse for another file.
type use struct {
	users int
	gone  bool // out of the table: the last user closes the file
}

// take records one more user; the table's lock is held.
func (u *use) take() { u.users++ }

// drop records that a user is done and says whether the file must be
// closed now; the table's lock is held.
func (u *use) drop() bool {
	u.users--
	return u.gone && u.users == 0
}

// remove takes the entry out of use by the table and says whether the
// file can be closed now (no request uses it); the table's lock is held.
func (u *use) remove() bool {
	u.gone = true
	return u.users == 0
}

// table holds a session's nodes and handles. Node ids and handle ids are
// never reused within a session, so a stale id from the guest finds
// nothing rather than another file. Both are bounded (each entry is a host
// descriptor). Safe for concurrent use.
type table struct {
	maxNodes, maxHandles int

	mu         sync.Mutex
	nodes      map[uint64]*node
	byKey      map[hostfs.Key]uint64
	handles    map[uint64]*handle
	readers    int // nodes holding a reader, bounded by maxHandles
	nextNode   uint64
	nextHandle uint64
}

func newTable(root hostfs.Node, maxNodes, maxHandles int) *table {
	t := &table{
		maxNodes: maxNodes, maxHandles: maxHandles,
		nodes:    make(map[uint64]*node),
		byKey:    make(map[hostfs.Key]uint64),
		handles:  make(map[uint64]*handle),
		nextNode: fuse.FUSE_ROOT_ID,
	}
	// The root is never forgotten (the kernel never sends FORGET for it).
	t.nodes[fuse.FUSE_ROOT_ID] = &node{file: root, mode: fuse.S_IFDIR, lookups: 1}
	return t
}

// node returns the node with this id, for the caller's use until it
// calls putNode.
func (t *table) node(id uint64) (*node, fuse.Status) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.nodes[id]
	if !ok {
		return nil, fuse.Status(syscall.ESTALE)
	}
	n.take()
	return n, fuse.OK
}

// putNode ends a use of a node from node or lookupByKey.
func (t *table) putNode(n *node) {
	t.mu.Lock()
	last := n.drop()
	t.mu.Unlock()
	if last {
		n.close()
	}
}

// add records one lookup of the inode key names and returns its node id:
// the existing node's (f is then closed: the node keeps its own file), or
// a new node holding f. ENFILE when the table is full.
func (t *table) add(key hostfs.Key, f hostfs.Node, mode uint32) (uint64, fuse.Status) {
	t.mu.Lock()
	if id, ok := t.byKey[key]; ok {
		t.nodes[id].lookups++
		t.mu.Unlock()
		_ = f.Close()
		return id, fuse.OK
	}
	if len(t.nodes) >= t.maxNodes {
		t.mu.Unlock()
		_ = f.Close()
		return 0, fuse.Status(syscall.ENFILE)
	}
	t.nextNode++
	id := t.nextNode
	t.nodes[id] = &node{file: f, key: key, mode: mode & syscall.S_IFMT, lookups: 1}
	t.byKey[key] = id
	t.mu.Unlock()
	return id, fuse.OK
}

// relookup records one more lookup of the node of an inode key and
// returns its id, if the guest still holds it.
func (t *table) relookup(key hostfs.Key) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.byKey[key]
	if ok {
		t.nodes[id].lookups++
	}
	return id, ok
}

// lookupByKey returns the node of an inode key, if the guest holds it,
// for the caller's use until it calls putNode.
func (t *table) lookupByKey(key hostfs.Key) (*node, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.byKey[key]
	if !ok {
		return nil, false
	}
	n := t.nodes[id]
	n.take()
	return n, true
}

// forget lowers a node's lookup count by n (a guest that forgets more
// than it looked up forgets the node) and closes its file at zero (or its
// last user does). The root and unknown ids are ignored.
func (t *table) forget(id, n uint64) {
	if id == fuse.FUSE_ROOT_ID {
		return
	}
	t.mu.Lock()
	nd, ok := t.nodes[id]
	if !ok {
		t.mu.Unlock()
		return
	}
	if n < nd.lookups {
		nd.lookups -= n
		t.mu.Unlock()
		return
	}
	delete(t.nodes, id)
	delete(t.byKey, nd.key)
	if nd.reader != nil {
		t.readers--
	}
	unused := nd.remove()
	t.mu.Unlock()
	if unused {
		nd.close()
	}
}

// reader returns node n's file opened for reading, which the caller (a
// user of n) closes when done if transient is set. The node keeps the
// first one opened for the READs that follow, unless maxHandles nodes
// already keep one (each is a host descriptor): then every READ of the
// node opens its own.
func (t *table) reader(n *node) (file hostfs.Node, transient bool, st fuse.Status) {
	t.mu.Lock()
	file = n.reader
	t.mu.Unlock()
	if file != nil {
		return file, false, fuse.OK
	}
	clone, err := openClone(n.file, unix.O_RDONLY)
	if err != nil {
		return nil, false, status(err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// Another READ's open may have come first, or the node left the table.
	if n.reader != nil || n.gone || t.readers >= t.maxHandles {
		return clone, true, fuse.OK
	}
	n.reader = clone
	t.readers++
	return clone, false, fuse.OK
}

// open records an open file or directory and returns its handle id.
// ENFILE when the table is full (f is then closed).
func (t *table) open(f hostfs.Node, dir bool) (uint64, fuse.Status) {
	t.mu.Lock()
	if len(t.handles) >= t.maxHandles {
		t.mu.Unlock()
		_ = f.Close()
		return 0, fuse.Status(syscall.ENFILE)
	}
	t.nextHandle++
	id := t.nextHandle
	t.handles[id] = &handle{file: f, dir: dir}
	t.mu.Unlock()
	return id, fuse.OK
}

// handle returns the open handle id, of a directory when dir is set and
// of a file otherwise (EBADF for an unknown id or the other kind), for the
// caller's use until it calls putHandle.
func (t *table) handle(id uint64, dir bool) (*handle, fuse.Status) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.handles[id]
	if !ok || h.dir != dir {
		return nil, fuse.EBADF
	}
	h.take()
	return h, fuse.OK
}

// putHandle ends a use of a handle from handle.
func (t *table) putHandle(h *handle) {
	t.mu.Lock()
	last := h.drop()
	t.mu.Unlock()
	if last {
		_ = h.file.Close()
	}
}

// release closes an open handle (or its last user does); unknown ids and
// the other kind are ignored.
func (t *table) release(id uint64, dir bool) {
	t.mu.Lock()
	h, ok := t.handles[id]
	if !ok || h.dir != dir {
		t.mu.Unlock()
		return
	}
	delete(t.handles, id)
	unused := h.remove()
	t.mu.Unlock()
	if unused {
		_ = h.file.Close()
	}
}

// counts returns how many nodes and handles the table holds.
func (t *table) counts() (nodes, handles int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.nodes), len(t.handles)
}

// closeAll closes every handle and node (the session ended: the guest
// reset the device or the VM stopped; no request is running).
func (t *table) closeAll() {
	t.mu.Lock()
	handles, nodes := t.handles, t.nodes
	t.handles, t.nodes = map[uint64]*handle{}, map[uint64]*node{}
	clear(t.byKey)
	t.readers = 0
	t.mu.Unlock()
	for _, h := range handles {
		_ = h.file.Close()
	}
	for _, n := range nodes {
		n.close()
	}
}
