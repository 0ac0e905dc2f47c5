package p9

import (
	"testing"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The adapter gives the guest the export layer's errno exactly: the p9
// server folds a unix.Errno it is handed (ENOTEMPTY into EEXIST, for
// one), so nodeFile converts each to linux.Errno first.
func TestAdapterKeepsTheExactErrno(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "rw", false, map[string]string{"sub/f": "x"})
	root, err := r.client(t).Attach("rw")
	require.NoError(t, err)
	defer root.Close()
	err = root.UnlinkAt("sub", unix.AT_REMOVEDIR)
	assert.ErrorIs(t, err, linux.ENOTEMPTY)
	_, _, err = root.Walk([]string{"missing"})
	assert.ErrorIs(t, err, linux.ENOENT)
}

// The attach root reports only what it has (a mode, a link count and a
// size), and an export's files their whole host attributes.
func TestAdapterAttributes(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "rw", false, map[string]string{"f": "hello"})
	c := r.client(t)
	top, err := c.Attach("")
	require.NoError(t, err)
	defer top.Close()
	_, valid, attr, err := top.GetAttr(p9lib.AttrMaskAll)
	require.NoError(t, err)
	assert.Equal(t, p9lib.AttrMask{Mode: true, NLink: true, Size: true}, valid)
	assert.Equal(t, p9lib.ModeDirectory|0o555, attr.Mode)

	qids, f, err := top.Walk([]string{"rw", "f"})
	require.NoError(t, err)
	defer f.Close()
	require.Len(t, qids, 2)
	_, valid, attr, err = f.GetAttr(p9lib.AttrMaskAll)
	require.NoError(t, err)
	assert.True(t, valid.UID && valid.MTime && valid.Blocks)
	assert.Equal(t, uint64(5), attr.Size)
	_, _, err = f.Open(p9lib.ReadOnly)
	require.NoError(t, err)
	buf := make([]byte, 16)
	n, err := f.ReadAt(buf, 0)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(buf[:n]))
}
