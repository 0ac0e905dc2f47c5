package hostfs

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
)

// Every descriptor a file holds is counted in the budget while it is
// held: a walked node one, an open file two, a clunked directory whose
// child still holds it one more; Close and withdrawal give them back.
func TestBudgetCountsEveryDescriptorHeld(t *testing.T) {
	share := fdlimit.NewPool(1 << 20).Share(4)
	defer share.Close()
	h := &harness{base: t.TempDir(), exports: NewExportsWithin(discard(), share)}
	defer h.exports.Close()
	h.export(t, "e", false, map[string]string{"d/f": "x"})
	root := h.exports.Root()
	e, _, err := root.Walk("e")
	require.NoError(t, err)
	d, _, err := e.Walk("d")
	require.NoError(t, err)
	require.NoError(t, e.Close())
	assert.Equal(t, 2, share.Held(), "the clunked export root is still held by d")
	f, _, err := d.Walk("f")
	require.NoError(t, err)
	require.NoError(t, d.Close())
	assert.Equal(t, 3, share.Held(), "e and d both pinned by f")
	_, err = f.Open(unix.O_RDONLY)
	require.NoError(t, err)
	assert.Equal(t, 4, share.Held())
	_, err = f.Clone()
	assert.ErrorIs(t, err, unix.ENFILE, "past the budget")
	require.NoError(t, f.Close())
	assert.Zero(t, share.Held(), "the last child's Close gives back its ancestors")

	e, _, err = root.Walk("e")
	require.NoError(t, err)
	d, _, err = e.Walk("d")
	require.NoError(t, err)
	assert.Equal(t, 2, share.Held())
	h.exports.Remove("e")
	assert.Zero(t, share.Held(), "withdrawal gives back everything at once")
	require.NoError(t, d.Close())
	require.NoError(t, e.Close())
	assert.Zero(t, share.Held())
}
