package arm64

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
)

// fdtNode is a decoded device tree node.
type fdtNode struct {
	name     string
	props    map[string][]byte
	order    []string // property names in blob order
	children []*fdtNode
}

// child returns the child named name, nil if none.
func (n *fdtNode) child(name string) *fdtNode {
	for _, c := range n.children {
		if c.name == name {
			return c
		}
	}
	return nil
}

// lookup walks a path of child names ("cpus/cpu@0").
func (n *fdtNode) lookup(path string) *fdtNode {
	for _, part := range strings.Split(path, "/") {
		if n = n.child(part); n == nil {
			return nil
		}
	}
	return n
}

func (n *fdtNode) childNames() []string {
	var names []string
	for _, c := range n.children {
		names = append(names, c.name)
	}
	return names
}

// str decodes a property as one NUL-terminated string.
func (n *fdtNode) str(name string) (string, error) {
	v, ok := n.props[name]
	if !ok {
		return "", fmt.Errorf("no property %q in %q", name, n.name)
	}
	if len(v) == 0 || v[len(v)-1] != 0 || bytes.IndexByte(v, 0) != len(v)-1 {
		return "", fmt.Errorf("property %q is not one string: %q", name, v)
	}
	return string(v[:len(v)-1]), nil
}

// cells decodes a property as big-endian 32-bit cells.
func (n *fdtNode) cells(name string) ([]uint32, error) {
	v, ok := n.props[name]
	if !ok {
		return nil, fmt.Errorf("no property %q in %q", name, n.name)
	}
	if len(v)%4 != 0 {
		return nil, fmt.Errorf("property %q is %d bytes, not cells", name, len(v))
	}
	c := make([]uint32, len(v)/4)
	for i := range c {
		c[i] = binary.BigEndian.Uint32(v[4*i:])
	}
	return c, nil
}

// u64s decodes a property as big-endian 64-bit values.
func (n *fdtNode) u64s(name string) ([]uint64, error) {
	c, err := n.cells(name)
	if err != nil {
		return nil, err
	}
	if len(c)%2 != 0 {
		return nil, fmt.Errorf("property %q has an odd number of cells", name)
	}
	v := make([]uint64, len(c)/2)
	for i := range v {
		v[i] = uint64(c[2*i])<<32 | uint64(c[2*i+1])
	}
	return v, nil
}

// fdtHeader is the decoded DTB header.
type fdtHeader struct {
	magic, totalSize, offStruct, offStrings, offRsvmap, version, lastComp, bootCPU, sizeStrings, sizeStruct uint32
}

// parseFDT decodes a DTB strictly, independently of the writer: header
// fields consistent with the blob, block alignment, an empty reservation
// map, tokens in order, names inside the strings block, a deduplicated
// strings block and FDT_END last.
func parseFDT(b []byte) (fdtHeader, *fdtNode, error) {
	var h fdtHeader
	if len(b) < fdtHeaderSize {
		return h, nil, fmt.Errorf("blob of %d bytes", len(b))
	}
	fields := []*uint32{&h.magic, &h.totalSize, &h.offStruct, &h.offStrings, &h.offRsvmap, &h.version, &h.lastComp, &h.bootCPU, &h.sizeStrings, &h.sizeStruct}
	for i, f := range fields {
		*f = binary.BigEndian.Uint32(b[4*i:])
	}
	switch {
	case h.magic != fdtMagic || h.version != 17 || h.lastComp != 16:
		return h, nil, fmt.Errorf("header %+v", h)
	case int(h.totalSize) != len(b):
		return h, nil, fmt.Errorf("totalsize %d, blob %d", h.totalSize, len(b))
	case h.offRsvmap%8 != 0 || h.offStruct%4 != 0:
		return h, nil, fmt.Errorf("misaligned blocks %+v", h)
	case uint64(h.offStruct)+uint64(h.sizeStruct) > uint64(len(b)) || uint64(h.offStrings)+uint64(h.sizeStrings) > uint64(len(b)):
		return h, nil, fmt.Errorf("blocks outside the blob %+v", h)
	case uint64(h.offRsvmap)+16 > uint64(h.offStruct):
		return h, nil, fmt.Errorf("reservation map overlaps the structure block")
	}
	if !bytes.Equal(b[h.offRsvmap:h.offRsvmap+16], make([]byte, 16)) {
		return h, nil, fmt.Errorf("reservation map is not empty")
	}
	strs := b[h.offStrings : h.offStrings+h.sizeStrings]
	if err := checkStringsBlock(strs); err != nil {
		return h, nil, err
	}
	root, err := parseStructure(b[h.offStruct:h.offStruct+h.sizeStruct], strs)
	return h, root, err
}

// checkStringsBlock checks the block is NUL-terminated names, each once.
func checkStringsBlock(strs []byte) error {
	if len(strs) == 0 {
		return nil
	}
	if strs[len(strs)-1] != 0 {
		return fmt.Errorf("strings block not NUL-terminated")
	}
	names := strings.Split(string(strs[:len(strs)-1]), "\x00")
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return fmt.Errorf("name %q twice in the strings block", n)
		}
		seen[n] = true
	}
	return nil
}

// parseStructure decodes the structure block into the root node.
func parseStructure(s, strs []byte) (*fdtNode, error) {
	var stack []*fdtNode
	var root *fdtNode
	pos := 0
	u32 := func() (uint32, error) {
		if pos+4 > len(s) {
			return 0, fmt.Errorf("structure block truncated at %d", pos)
		}
		v := binary.BigEndian.Uint32(s[pos:])
		pos += 4
		return v, nil
	}
	for {
		tok, err := u32()
		if err != nil {
			return nil, err
		}
		switch tok {
		case fdtBeginNode:
			end := bytes.IndexByte(s[pos:], 0)
			if end < 0 {
				return nil, fmt.Errorf("unterminated node name at %d", pos)
			}
			n := &fdtNode{name: string(s[pos : pos+end]), props: map[string][]byte{}}
			if pos, err = skipPadding(s, pos+end+1); err != nil {
				return nil, err
			}
			if len(stack) == 0 {
				if root != nil {
					return nil, fmt.Errorf("second root node %q", n.name)
				}
				root = n
			} else {
				top := stack[len(stack)-1]
				top.children = append(top.children, n)
			}
			stack = append(stack, n)
		case fdtEndNode:
			if len(stack) == 0 {
				return nil, fmt.Errorf("FDT_END_NODE with no node open")
			}
			stack = stack[:len(stack)-1]
		case fdtProp:
			if err := parseProp(s, &pos, strs, stack); err != nil {
				return nil, err
			}
		case fdtEnd:
			if len(stack) != 0 || root == nil || pos != len(s) {
				return nil, fmt.Errorf("FDT_END at %d of %d with %d nodes open", pos, len(s), len(stack))
			}
			return root, nil
		default:
			return nil, fmt.Errorf("token %#x at %d", tok, pos-4)
		}
	}
}

func parseProp(s []byte, pos *int, strs []byte, stack []*fdtNode) error {
	if len(stack) == 0 {
		return fmt.Errorf("property outside a node")
	}
	if *pos+8 > len(s) {
		return fmt.Errorf("property header truncated")
	}
	length, nameOff := binary.BigEndian.Uint32(s[*pos:]), binary.BigEndian.Uint32(s[*pos+4:])
	*pos += 8
	if uint64(*pos)+uint64(length) > uint64(len(s)) || nameOff >= uint32(len(strs)) {
		return fmt.Errorf("property value or name outside its block")
	}
	end := bytes.IndexByte(strs[nameOff:], 0)
	name := string(strs[nameOff : int(nameOff)+end])
	n := stack[len(stack)-1]
	if _, dup := n.props[name]; dup {
		return fmt.Errorf("property %q twice in %q", name, n.name)
	}
	n.props[name] = append([]byte(nil), s[*pos:*pos+int(length)]...)
	n.order = append(n.order, name)
	var err error
	*pos, err = skipPadding(s, *pos+int(length))
	return err
}

// skipPadding returns pos rounded up to 4, checking the padding is zeros.
func skipPadding(s []byte, pos int) (int, error) {
	next := (pos + 3) &^ 3
	if next > len(s) {
		return 0, fmt.Errorf("padding at %d runs past the structure block", pos)
	}
	for _, c := range s[pos:next] {
		if c != 0 {
			return 0, fmt.Errorf("non-zero padding at %d", pos)
		}
	}
	return next, nil
}

// sortedKeys returns a node's property names, sorted.
func (n *fdtNode) sortedKeys() []string {
	keys := append([]string(nil), n.order...)
	sort.Strings(keys)
	return keys
}
