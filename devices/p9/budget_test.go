package p9

import (
	"testing"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
)

// TestClunkLadderStaysInBudget: a guest that makes one directory level
// after another, walks into it and clunks each parent holds two fids,
// but every clunked parent's descriptor stays open while its child holds
// it. The descriptors the process holds must stay within the device's
// budget.
func TestClunkLadderStaysInBudget(t *testing.T) {
	const budget = 8
	share := fdlimit.NewPool(1 << 20).Share(budget)
	t.Cleanup(share.Close)
	r := newRigOver(t, Options{}, hostfs.NewExportsWithin(discardLogger(), share))
	r.export(t, "e1", false, nil)
	c := r.client(t)
	before := countFds(t)
	dir, err := c.Attach("e1")
	require.NoError(t, err)
	made := 0
	for range 300 {
		if _, err := dir.Mkdir("d", 0o755, p9lib.NoUID, p9lib.NoGID); err != nil {
			require.ErrorIs(t, err, linux.ENFILE, "level %d", made)
			break
		}
		_, child, err := dir.Walk([]string{"d"})
		if err != nil {
			require.ErrorIs(t, err, linux.ENFILE, "level %d", made)
			break
		}
		made++
		require.NoError(t, dir.Close())
		dir = child
	}
	held := countFds(t) - before
	t.Logf("levels %d, descriptors held %d", made, held)
	require.LessOrEqual(t, held, budget, "descriptors held by a clunked ladder of %d levels", made)
	require.NoError(t, dir.Close())
}

// TestOpenLoopStaysInBudget: a guest that walks to one file and opens it
// again and again (two descriptors per fid) is refused with ENFILE within
// the budget, and served again once it clunks them.
func TestOpenLoopStaysInBudget(t *testing.T) {
	const budget = 16
	share := fdlimit.NewPool(1 << 20).Share(budget)
	t.Cleanup(share.Close)
	r := newRigOver(t, Options{}, hostfs.NewExportsWithin(discardLogger(), share))
	r.export(t, "e1", false, map[string]string{"f": "data"})
	c := r.client(t)
	before := countFds(t)
	root, err := c.Attach("e1")
	require.NoError(t, err)
	var fids []p9lib.File
	for range 4 * budget {
		_, f, err := root.Walk([]string{"f"})
		if err == nil {
			fids = append(fids, f)
			_, _, err = f.Open(p9lib.ReadOnly)
		}
		if err != nil {
			require.ErrorIs(t, err, linux.ENFILE, "after %d fids", len(fids))
			break
		}
	}
	held := countFds(t) - before
	t.Logf("fids %d, descriptors held %d", len(fids), held)
	require.LessOrEqual(t, held, budget)
	for _, f := range fids {
		require.NoError(t, f.Close())
	}
	f := clientWalk(t, root, "f")
	_, _, err = f.Open(p9lib.ReadOnly)
	require.NoError(t, err, "served again once clunked")
	require.Equal(t, "data", readAt(t, f, 10))
	require.NoError(t, root.Close())
}
