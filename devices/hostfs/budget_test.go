package hostfs

import (
	"testing"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	root, err := h.exports.Attach()
	require.NoError(t, err)
	_, e, err := root.Walk([]string{"e"})
	require.NoError(t, err)
	_, d, err := e.Walk([]string{"d"})
	require.NoError(t, err)
	require.NoError(t, e.Close())
	assert.Equal(t, 2, share.Held(), "the clunked export root is still held by d")
	_, f, err := d.Walk([]string{"f"})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	assert.Equal(t, 3, share.Held(), "e and d both pinned by f")
	_, _, err = f.Open(p9.ReadOnly)
	require.NoError(t, err)
	assert.Equal(t, 4, share.Held())
	_, _, err = f.Walk(nil)
	assert.ErrorIs(t, err, linux.ENFILE, "past the budget")
	require.NoError(t, f.Close())
	assert.Zero(t, share.Held(), "the last child's Close gives back its ancestors")

	_, e, err = root.Walk([]string{"e"})
	require.NoError(t, err)
	_, d, err = e.Walk([]string{"d"})
	require.NoError(t, err)
	assert.Equal(t, 2, share.Held())
	h.exports.Remove("e")
	assert.Zero(t, share.Held(), "withdrawal gives back everything at once")
	require.NoError(t, d.Close())
	require.NoError(t, e.Close())
	assert.Zero(t, share.Held())
}
