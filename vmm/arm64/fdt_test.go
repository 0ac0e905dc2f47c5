package arm64

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFDTWriterLayout checks a small tree byte for byte against the spec:
// header fields, block offsets, token encoding, padding and one copy of
// each property name.
func TestFDTWriterLayout(t *testing.T) {
	w := newFDTWriter()
	w.BeginNode("")
	w.PropertyCells("#size-cells", 2)
	w.BeginNode("n@1")
	w.PropertyString("compatible", "ab")
	w.PropertyCells("#size-cells", 0) // same name: reuses the string
	w.EndNode()
	w.EndNode()
	b, err := w.Finish(7)
	require.NoError(t, err)

	be := binary.BigEndian
	strs := "#size-cells\x00compatible\x00"
	structure := []uint32{
		fdtBeginNode, 0, // "" plus NUL, padded to 4
		fdtProp, 4, 0, 2,
		fdtBeginNode, 0x6e403100, // "n@1\0"
		fdtProp, 3, 12, 0x61620000, // "ab\0" padded
		fdtProp, 4, 0, 0,
		fdtEndNode, fdtEndNode, fdtEnd,
	}
	require.Len(t, b, 40+16+4*len(structure)+len(strs))
	require.Equal(t, fdtMagic, be.Uint32(b[0:]))
	require.Equal(t, uint32(len(b)), be.Uint32(b[4:]), "totalsize")
	require.Equal(t, uint32(56), be.Uint32(b[8:]), "off_dt_struct")
	require.Equal(t, uint32(56+4*len(structure)), be.Uint32(b[12:]), "off_dt_strings")
	require.Equal(t, uint32(40), be.Uint32(b[16:]), "off_mem_rsvmap")
	require.Equal(t, uint32(17), be.Uint32(b[20:]), "version")
	require.Equal(t, uint32(16), be.Uint32(b[24:]), "last_comp_version")
	require.Equal(t, uint32(7), be.Uint32(b[28:]), "boot_cpuid_phys")
	require.Equal(t, uint32(len(strs)), be.Uint32(b[32:]), "size_dt_strings")
	require.Equal(t, uint32(4*len(structure)), be.Uint32(b[36:]), "size_dt_struct")
	require.Equal(t, make([]byte, 16), b[40:56], "empty reservation map")
	for i, want := range structure {
		require.Equal(t, want, be.Uint32(b[56+4*i:]), "structure word %d", i)
	}
	require.Equal(t, strs, string(b[56+4*len(structure):]))

	_, root, err := parseFDT(b)
	require.NoError(t, err)
	require.Equal(t, []string{"n@1"}, root.childNames())
}

// TestFDTWriterRefusesMisuse checks each misuse gives ErrFDT, and that the
// first error sticks.
func TestFDTWriterRefusesMisuse(t *testing.T) {
	cases := map[string]struct {
		build func(w *fdtWriter)
		want  string
	}{
		"property outside a node": {func(w *fdtWriter) { w.PropertyEmpty("x") }, "outside a node"},
		"end with none open":      {func(w *fdtWriter) { w.EndNode() }, "none open"},
		"named root":              {func(w *fdtWriter) { w.BeginNode("root") }, "must be the root"},
		"second root": {func(w *fdtWriter) {
			w.BeginNode("")
			w.EndNode()
			w.BeginNode("")
		}, "after the root node ended"},
		"unbalanced":        {func(w *fdtWriter) { w.BeginNode(""); w.BeginNode("a") }, "2 nodes left open"},
		"nothing":           {func(*fdtWriter) {}, "0 nodes left open"},
		"empty child name":  {func(w *fdtWriter) { w.BeginNode(""); w.BeginNode("") }, "1 to 31"},
		"long child name":   {func(w *fdtWriter) { w.BeginNode(""); w.BeginNode(strings.Repeat("a", 32)) }, "1 to 31"},
		"slash in name":     {func(w *fdtWriter) { w.BeginNode(""); w.BeginNode("a/b") }, "holds '/'"},
		"digit first":       {func(w *fdtWriter) { w.BeginNode(""); w.BeginNode("0a") }, "start with a letter"},
		"empty unit":        {func(w *fdtWriter) { w.BeginNode(""); w.BeginNode("a@") }, "bad unit address"},
		"two @":             {func(w *fdtWriter) { w.BeginNode(""); w.BeginNode("a@1@2") }, "holds '@'"},
		"NUL in node name":  {func(w *fdtWriter) { w.BeginNode(""); w.BeginNode("a\x00b") }, "holds '\\x00'"},
		"empty prop name":   {func(w *fdtWriter) { w.BeginNode(""); w.PropertyEmpty("") }, "1 to 31"},
		"long prop name":    {func(w *fdtWriter) { w.BeginNode(""); w.PropertyEmpty(strings.Repeat("p", 32)) }, "1 to 31"},
		"space in property": {func(w *fdtWriter) { w.BeginNode(""); w.PropertyEmpty("a b") }, "holds ' '"},
		"NUL in string":     {func(w *fdtWriter) { w.BeginNode(""); w.PropertyString("s", "a\x00b") }, "NUL byte"},
		"too deep": {func(w *fdtWriter) {
			w.BeginNode("")
			for range fdtMaxDepth {
				w.BeginNode("n")
			}
		}, "deeper than 16"},
		"too big": {func(w *fdtWriter) {
			w.BeginNode("")
			w.Property("big", make([]byte, DTBMaxSize))
		}, "exceeds 2097152 bytes"},
		"property twice": {func(w *fdtWriter) {
			w.BeginNode("")
			w.PropertyEmpty("x")
			w.PropertyCells("x", 1)
		}, "twice in one node"},
		"first error sticks": {func(w *fdtWriter) {
			w.EndNode()
			w.PropertyEmpty("x")
		}, "none open"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			w := newFDTWriter()
			c.build(w)
			b, err := w.Finish(0)
			require.ErrorIs(t, err, ErrFDT)
			require.ErrorContains(t, err, c.want)
			require.Nil(t, b)
		})
	}
}

// TestFDTWriterAcceptsSpecNames checks the characters the spec allows.
func TestFDTWriterAcceptsSpecNames(t *testing.T) {
	w := newFDTWriter()
	w.BeginNode("")
	w.PropertyEmpty("#a,b.c_d+e?f-G9")
	w.BeginNode("Az09,._+-@1,2.a_B+-")
	w.BeginNode(strings.Repeat("x", 31) + "@" + strings.Repeat("1", 31))
	w.EndNode()
	w.EndNode()
	w.EndNode()
	b, err := w.Finish(0)
	require.NoError(t, err)
	_, root, err := parseFDT(b)
	require.NoError(t, err)
	require.Contains(t, root.props, "#a,b.c_d+e?f-G9")
}

// TestFDTWriterSizeBound checks many small properties stop at DTBMaxSize
// rather than growing without bound.
func TestFDTWriterSizeBound(t *testing.T) {
	w := newFDTWriter()
	w.BeginNode("")
	n := 0
	for ; w.err == nil; n++ {
		w.PropertyCells(fmt.Sprintf("p%d", n), 1)
	}
	require.ErrorIs(t, w.err, ErrFDT)
	require.LessOrEqual(t, w.size(), int(DTBMaxSize))
	require.Greater(t, n, int(DTBMaxSize)/24, "the bound is the size, not a count")
}
