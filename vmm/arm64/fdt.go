package arm64

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// A flattened device tree (DTB, devicetree-specification v0.4 chapter 5) is
// a 40-byte header, a memory reservation block (pairs of big-endian u64
// address and size, ended by a zero pair), a structure block of 4-byte
// aligned big-endian tokens, and a strings block holding each property
// name once:
//
//	FDT_BEGIN_NODE  name, NUL, padding to 4 bytes
//	FDT_PROP        u32 value length, u32 name offset in the strings block,
//	                value, padding to 4 bytes
//	FDT_END_NODE
//	FDT_END         once, after the root node's FDT_END_NODE
const (
	fdtMagic          uint32 = 0xd00dfeed
	fdtVersion        uint32 = 17
	fdtLastCompatible uint32 = 16
	fdtHeaderSize            = 40
	fdtBeginNode      uint32 = 1
	fdtEndNode        uint32 = 2
	fdtProp           uint32 = 3
	fdtEnd            uint32 = 9

	// fdtMaxNameLen is the spec's bound on a node or property name (the
	// node-name part before '@', and a property name): 31 characters.
	fdtMaxNameLen = 31
	// fdtMaxDepth bounds node nesting; our tree is three deep.
	fdtMaxDepth = 16
)

// ErrFDT is returned for a device tree the writer refuses to build.
var ErrFDT = errors.New("device tree")

// fdtWriter builds a DTB. Its methods record the first misuse (a sticky
// error, so building code reads straight) and Finish reports it; after an
// error every call is a no-op. The output is bounded by DTBMaxSize.
type fdtWriter struct {
	structure []byte
	strings   []byte
	// nameOffsets deduplicates property names in the strings block.
	nameOffsets map[string]uint32
	// nodeProps holds the property names of each open node, innermost
	// last: a name may appear once per node.
	nodeProps []map[string]bool
	depth     int
	// rootDone is set when the root node has ended: nothing may follow.
	rootDone bool
	err      error
}

func newFDTWriter() *fdtWriter {
	return &fdtWriter{nameOffsets: make(map[string]uint32)}
}

func (w *fdtWriter) fail(format string, args ...any) {
	if w.err == nil {
		w.err = fmt.Errorf("%w: %s", ErrFDT, fmt.Sprintf(format, args...))
	}
}

func (w *fdtWriter) token(t uint32) {
	w.structure = binary.BigEndian.AppendUint32(w.structure, t)
}

// pad4 pads the structure block to a 4-byte boundary with zeros.
func (w *fdtWriter) pad4() {
	for len(w.structure)%4 != 0 {
		w.structure = append(w.structure, 0)
	}
}

// checkRoom fails when adding n bytes would take the blob past DTBMaxSize.
func (w *fdtWriter) checkRoom(n int) bool {
	if w.size()+n > int(DTBMaxSize) {
		w.fail("the tree exceeds %d bytes", DTBMaxSize)
		return false
	}
	return true
}

// size is the blob Finish would write now, less the FDT_END token.
func (w *fdtWriter) size() int {
	return fdtHeaderSize + 16 + len(w.structure) + 4 + len(w.strings)
}

// BeginNode opens a child of the current node (the root, when name is ""
// and no node is open).
func (w *fdtWriter) BeginNode(name string) {
	if w.err != nil {
		return
	}
	switch {
	case w.rootDone:
		w.fail("node %q after the root node ended", name)
		return
	case w.depth == 0 && name != "":
		w.fail("the first node must be the root (\"\"), not %q", name)
		return
	case w.depth >= fdtMaxDepth:
		w.fail("node %q nested deeper than %d", name, fdtMaxDepth)
		return
	case w.depth > 0:
		if err := checkNodeName(name); err != nil {
			w.fail("%v", err)
			return
		}
	}
	if !w.checkRoom(4 + len(name) + 4) {
		return
	}
	w.token(fdtBeginNode)
	w.structure = append(w.structure, name...)
	w.structure = append(w.structure, 0)
	w.pad4()
	w.depth++
	w.nodeProps = append(w.nodeProps, make(map[string]bool))
}

// EndNode closes the current node.
func (w *fdtWriter) EndNode() {
	if w.err != nil {
		return
	}
	if w.depth == 0 {
		w.fail("end of a node with none open")
		return
	}
	if !w.checkRoom(4) {
		return
	}
	w.token(fdtEndNode)
	w.depth--
	w.nodeProps = w.nodeProps[:w.depth]
	w.rootDone = w.depth == 0
}

// Property adds a property with a raw value to the current node.
func (w *fdtWriter) Property(name string, value []byte) {
	if w.err != nil {
		return
	}
	if w.depth == 0 {
		w.fail("property %q outside a node", name)
		return
	}
	if err := checkPropertyName(name); err != nil {
		w.fail("%v", err)
		return
	}
	if w.nodeProps[w.depth-1][name] {
		w.fail("property %q twice in one node", name)
		return
	}
	off, known := w.nameOffsets[name]
	extra := 0
	if !known {
		extra = len(name) + 1
	}
	if !w.checkRoom(12 + len(value) + 3 + extra) {
		return
	}
	if !known {
		off = uint32(len(w.strings))
		w.strings = append(w.strings, name...)
		w.strings = append(w.strings, 0)
		w.nameOffsets[name] = off
	}
	w.nodeProps[w.depth-1][name] = true
	w.token(fdtProp)
	w.structure = binary.BigEndian.AppendUint32(w.structure, uint32(len(value)))
	w.structure = binary.BigEndian.AppendUint32(w.structure, off)
	w.structure = append(w.structure, value...)
	w.pad4()
}

// PropertyEmpty adds a property with no value (a boolean true).
func (w *fdtWriter) PropertyEmpty(name string) { w.Property(name, nil) }

// PropertyCells adds a property of big-endian 32-bit cells.
func (w *fdtWriter) PropertyCells(name string, cells ...uint32) {
	v := make([]byte, 0, 4*len(cells))
	for _, c := range cells {
		v = binary.BigEndian.AppendUint32(v, c)
	}
	w.Property(name, v)
}

// PropertyU64 adds a property of big-endian 64-bit values (two cells each).
func (w *fdtWriter) PropertyU64(name string, values ...uint64) {
	v := make([]byte, 0, 8*len(values))
	for _, x := range values {
		v = binary.BigEndian.AppendUint64(v, x)
	}
	w.Property(name, v)
}

// PropertyString adds a NUL-terminated string property.
func (w *fdtWriter) PropertyString(name, value string) {
	w.PropertyStrings(name, value)
}

// PropertyStrings adds a string-list property (each string NUL-terminated).
// A string holding a NUL would split in two, so it is refused.
func (w *fdtWriter) PropertyStrings(name string, values ...string) {
	var v []byte
	for _, s := range values {
		if strings.IndexByte(s, 0) >= 0 {
			w.fail("property %q: string holds a NUL byte", name)
			return
		}
		v = append(v, s...)
		v = append(v, 0)
	}
	w.Property(name, v)
}

// Finish returns the DTB, with bootCPU (the boot CPU's reg) in the header
// and an empty memory reservation block, or the first misuse recorded.
func (w *fdtWriter) Finish(bootCPU uint32) ([]byte, error) {
	if w.err != nil {
		return nil, w.err
	}
	if !w.rootDone {
		return nil, fmt.Errorf("%w: %d nodes left open", ErrFDT, w.depth)
	}
	const rsvmapOff = fdtHeaderSize // 40: already 8-byte aligned
	structOff := rsvmapOff + 16     // only the terminating zero pair
	structSize := len(w.structure) + 4
	stringsOff := structOff + structSize
	total := stringsOff + len(w.strings)
	if total > int(DTBMaxSize) {
		return nil, fmt.Errorf("%w: the tree exceeds %d bytes", ErrFDT, DTBMaxSize)
	}
	b := make([]byte, 0, total)
	for _, v := range []uint32{
		fdtMagic, uint32(total), uint32(structOff), uint32(stringsOff), rsvmapOff,
		fdtVersion, fdtLastCompatible, bootCPU, uint32(len(w.strings)), uint32(structSize),
	} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	b = append(b, make([]byte, 16)...)
	b = append(b, w.structure...)
	b = binary.BigEndian.AppendUint32(b, fdtEnd)
	b = append(b, w.strings...)
	return b, nil
}

// checkNodeName checks a node name: node-name[@unit-address], the node-name
// 1 to 31 characters of [0-9a-zA-Z,._+-] starting with a letter, the unit
// address of the same characters.
func checkNodeName(name string) error {
	base, unit, hasUnit := strings.Cut(name, "@")
	if len(base) == 0 || len(base) > fdtMaxNameLen {
		return fmt.Errorf("node name %q: want 1 to %d characters before '@'", name, fdtMaxNameLen)
	}
	if !isLetter(base[0]) {
		return fmt.Errorf("node name %q does not start with a letter", name)
	}
	if hasUnit && (len(unit) == 0 || len(unit) > fdtMaxNameLen) {
		return fmt.Errorf("node name %q: bad unit address", name)
	}
	for _, part := range []string{base, unit} {
		for i := 0; i < len(part); i++ {
			if !isNodeNameChar(part[i]) {
				return fmt.Errorf("node name %q holds %q", name, part[i])
			}
		}
	}
	return nil
}

// checkPropertyName checks a property name: 1 to 31 characters of
// [0-9a-zA-Z,._+?#-].
func checkPropertyName(name string) error {
	if len(name) == 0 || len(name) > fdtMaxNameLen {
		return fmt.Errorf("property name %q: want 1 to %d characters", name, fdtMaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isNodeNameChar(c) && c != '?' && c != '#' {
			return fmt.Errorf("property name %q holds %q", name, c)
		}
	}
	return nil
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func isNodeNameChar(c byte) bool {
	return isLetter(c) || '0' <= c && c <= '9' || c == ',' || c == '.' || c == '_' || c == '+' || c == '-'
}
