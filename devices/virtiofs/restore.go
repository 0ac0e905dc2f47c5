package virtiofs

import (
	"fmt"
	"syscall"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
)

// rebuildTable makes a session's table from its saved state, over the
// device's Root: each node walked to again from the attach root and kept
// if it is the same inode (host device and inode) of the same type; the
// others are left out (ESTALE to the guest). An export root that is not
// the same fails it. The id counters go on from the saved ones, so no id
// the guest saw is given again.
func (d *Device) rebuildTable(ss *savedSession) (*table, error) {
	root := d.opts.Root.Root()
	t := newTable(root, d.opts.MaxNodes, d.opts.MaxHandles)
	t.nextNode, t.nextHandle = ss.NextNode, ss.NextHandle
	r := newResolver(root)
	defer r.close()
	stale := 0
	for _, sn := range ss.Nodes {
		file, attr, err := r.resolve(sn.Export, sn.Path)
		same := err == nil && attr.Key.Dev == sn.Dev && attr.Key.Ino == sn.Ino && attr.Stat.Mode&syscall.S_IFMT == sn.Mode
		if same {
			if _, dup := t.byKey[attr.Key]; dup {
				same = false // two saved nodes of one inode: not a state we wrote
			}
		}
		if !same {
			if file != nil {
				_ = file.Close()
			}
			if len(sn.Path) == 0 {
				t.closeAll()
				return nil, exportRootError(sn.Export, err)
			}
			stale++
			continue
		}
		t.nodes[sn.ID] = &node{file: file, key: attr.Key, mode: sn.Mode, lookups: sn.Lookups}
		t.byKey[attr.Key] = sn.ID
	}
	d.log.Info("virtio-fs: session restored", "nodes", len(t.nodes), "stale", stale)
	return t, nil
}

// exportRootError says that an export root the guest held is not there
// again: walking to it failed with err, or found another directory.
func exportRootError(export string, err error) error {
	if err != nil {
		return fmt.Errorf("virtio-fs: export %q, which the guest holds, is not there after the restore: %w", export, err)
	}
	return fmt.Errorf("virtio-fs: export %q, which the guest holds, is another directory after the restore", export)
}

// resolver walks saved paths from the attach root, each directory on the
// way once (as the guest's lookups shared them), so nodes below one
// directory share its descriptor and the walks cost one per distinct
// component. Its own Nodes are closed by close; a node it returns is a
// Clone, the caller's.
type resolver struct {
	root    hostfs.Node
	walked  []walkedNode
	byPlace map[place]int // index into walked
}

// walkedNode is the outcome of one walk.
type walkedNode struct {
	node hostfs.Node // nil when err is set
	attr hostfs.Attr
	err  error
}

// place is a name in a walked directory (parent -1: the attach root).
type place struct {
	parent int
	name   string
}

func newResolver(root hostfs.Node) *resolver {
	return &resolver{root: root, byPlace: make(map[place]int)}
}

// resolve walks to export's path and returns a Node of its own for it.
func (r *resolver) resolve(export string, path []string) (hostfs.Node, hostfs.Attr, error) {
	at := r.walk(place{parent: -1, name: export})
	for _, name := range path {
		if r.walked[at].err != nil {
			break
		}
		at = r.walk(place{parent: at, name: name})
	}
	w := r.walked[at]
	if w.err != nil {
		return nil, hostfs.Attr{}, w.err
	}
	n, err := w.node.Clone()
	return n, w.attr, err
}

// walk returns the index of p's walk, walking it the first time.
func (r *resolver) walk(p place) int {
	if i, ok := r.byPlace[p]; ok {
		return i
	}
	from := r.root
	if p.parent >= 0 {
		from = r.walked[p.parent].node
	}
	n, attr, err := from.Walk(p.name)
	r.walked = append(r.walked, walkedNode{node: n, attr: attr, err: err})
	r.byPlace[p] = len(r.walked) - 1
	return len(r.walked) - 1
}

// close closes the resolver's Nodes (the directories its returned Nodes
// sit in stay open while those live).
func (r *resolver) close() {
	for _, w := range r.walked {
		if w.node != nil {
			_ = w.node.Close()
		}
	}
}
