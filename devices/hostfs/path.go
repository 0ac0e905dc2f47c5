package hostfs

import (
	"slices"

	"golang.org/x/sys/unix"
)

// MaxPathDepth bounds the components PathOf returns: a Linux path of
// PATH_MAX bytes has at most this many (one byte and a slash each).
const MaxPathDepth = unix.PathMax / 2

// CheckName refuses anything but one ordinary path component (the names
// Walk accepts): "", ".", "..", a slash, a NUL or more than 255 bytes are
// EINVAL or ENAMETOOLONG. For clients that read names back from storage.
func CheckName(name string) error { return checkName(name) }

// PathOf returns where n stands in the tree of its Exports, as a client
// walks to it again from the attach root: the name of its export and the
// components from the export's root to it (none for an export root);
// export "" and no components for the attach root. It is how a client
// records its nodes to find them again over a fresh Exports holding the
// same exports under the same names (the virtio-fs device's session
// across a VM snapshot): walking there later is checked as any walk, and
// may find another file or none. A node its client renamed (Renamed) is
// where the rename put it; one the host moved is where it was. ESTALE
// once the export is withdrawn, EINVAL for a Node of another
// implementation, ENAMETOOLONG past MaxPathDepth components.
func PathOf(n Node) (export string, components []string, err error) {
	switch f := n.(type) {
	case *rootFile:
		return "", nil, nil
	case *file:
		return f.path()
	}
	return "", nil, unix.EINVAL
}

// path is PathOf for a node of an export: the names up its parent chain.
// A single-file export's one file is reached by its view name, which may
// differ from the host file's (a registered symlink).
func (f *file) path() (string, []string, error) {
	if err := f.ex.enter(); err != nil {
		return "", nil, err
	}
	defer f.ex.exit()
	var names []string
	for cur := f; ; {
		parent, name := cur.parentAndName()
		if parent == nil {
			break
		}
		if len(names) == MaxPathDepth {
			return "", nil, unix.ENAMETOOLONG
		}
		names = append(names, name)
		cur = parent
	}
	slices.Reverse(names)
	if f.ex.isFileView() && len(names) > 0 {
		names[0] = f.ex.viewName
	}
	return f.ex.name, names, nil
}
