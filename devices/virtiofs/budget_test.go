package virtiofs

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
)

// newBudgetRig is a rig whose exports hold at most budget descriptors.
func newBudgetRig(t *testing.T, opts Options, budget int) *rig {
	share := fdlimit.NewPool(1 << 20).Share(budget)
	t.Cleanup(share.Close)
	return newRigOver(t, opts, hostfs.NewExportsWithin(discardLogger(), share))
}

// ladderLevels is how deep the hostile ladders go.
const ladderLevels = 300

// TestForgetLadderStaysInBudget: a guest that makes one directory level
// after another and FORGETs each parent leaves the table holding two
// nodes, but every forgotten parent's descriptor stays open while its
// child holds it. The descriptors the process holds must stay within the
// device's budget.
func TestForgetLadderStaysInBudget(t *testing.T) {
	const budget = 16
	r := newBudgetRig(t, Options{}, budget)
	r.export(t, "e1", false, nil)
	r.initSession(t)
	before := openFds(t)
	node := r.walk(t, "e1")
	made := 0
	for range ladderLevels {
		e, errno := r.mkdir(t, node, "d", 0o755)
		if errno != 0 {
			require.Equal(t, syscall.ENFILE, errno, "level %d", made)
			break
		}
		made++
		r.forget(t, node, 1)
		node = e.NodeId
	}
	held := openFds(t) - before
	nodes, _ := r.dev.Counts()
	t.Logf("levels %d, nodes %d, descriptors held %d", made, nodes, held)
	require.LessOrEqual(t, held, budget, "descriptors held by a forgotten ladder (%d levels, %d nodes)", made, nodes)
}

// TestOpenLoopStaysInBudget: a guest that opens one file again and again
// holds two host descriptors per handle (the clone's O_PATH one and the
// open one). The opens must be refused (ENFILE) once the budget is spent,
// with the descriptors held within it, and the device must serve a fresh
// lookup and read once the handles are released.
func TestOpenLoopStaysInBudget(t *testing.T) {
	const budget = 64
	r := newBudgetRig(t, Options{}, budget)
	r.export(t, "e1", false, map[string]string{"f": "data"})
	r.initSession(t)
	before := openFds(t)
	f := r.walk(t, "e1", "f")
	var handles []uint64
	refused := syscall.Errno(0)
	for range 4 * budget {
		fh, errno := r.open(t, f, syscall.O_RDONLY)
		if errno != 0 {
			refused = errno
			break
		}
		handles = append(handles, fh)
	}
	held := openFds(t) - before
	t.Logf("handles %d, descriptors held %d, refused with %v", len(handles), held, refused)
	require.LessOrEqual(t, held, budget, "descriptors held by %d handles of one file", len(handles))
	require.Contains(t, []syscall.Errno{syscall.ENFILE, syscall.EMFILE}, refused, "the open past the budget")

	for _, fh := range handles {
		r.release(t, f, fh, opRelease)
	}
	g, errno := r.lookup(t, r.walk(t, "e1"), "f")
	require.Zero(t, errno, "a fresh lookup once released")
	fh, errno := r.open(t, g.NodeId, syscall.O_RDONLY)
	require.Zero(t, errno)
	data, errno := r.read(t, g.NodeId, fh, 0, 100)
	require.Zero(t, errno)
	require.Equal(t, "data", string(data))
}

// TestNoOpenReadersStayInBudget: a NoOpen device's nodes keep a reader
// (two descriptors) beside their own; they come out of the same budget,
// so a guest reading file after file is refused (ENFILE) within it, and
// is served again once it forgets them.
func TestNoOpenReadersStayInBudget(t *testing.T) {
	const budget = 32
	r := newBudgetRig(t, Options{Cached: true, NoOpen: true}, budget)
	files := map[string]string{}
	for i := range 2 * budget {
		files["f"+itoa(i)] = "x"
	}
	r.export(t, "e1", true, files)
	r.initSession(t)
	before := openFds(t)
	e1 := r.walk(t, "e1")
	var nodes []uint64
	refused := syscall.Errno(0)
	for i := range 2 * budget {
		e, errno := r.lookup(t, e1, "f"+itoa(i))
		if errno == 0 {
			nodes = append(nodes, e.NodeId)
			_, errno = r.read(t, e.NodeId, 0, 0, 10)
		}
		if errno != 0 {
			refused = errno
			break
		}
	}
	held := openFds(t) - before
	t.Logf("files read %d, descriptors held %d, refused with %v", len(nodes), held, refused)
	require.LessOrEqual(t, held, budget)
	require.Equal(t, syscall.ENFILE, refused)

	for _, n := range nodes {
		r.forget(t, n, 1)
	}
	e, errno := r.lookup(t, e1, "f000")
	require.Zero(t, errno, "a fresh lookup once forgotten")
	got, errno := r.read(t, e.NodeId, 0, 0, 10)
	require.Zero(t, errno)
	require.Equal(t, "x", string(got))
}

// openUntilRefused opens node f again and again until the device refuses,
// returning how many opens succeeded and the refusal.
func openUntilRefused(t *testing.T, r *rig, f uint64, most int) (int, syscall.Errno) {
	for i := range most {
		if _, errno := r.open(t, f, syscall.O_RDONLY); errno != 0 {
			return i, errno
		}
	}
	return most, 0
}

// TestDevicesShareOneBudget: two devices drawing from one helper-wide
// pool each get an equal part, less than one device alone had, and
// together never hold more than the pool's total.
func TestDevicesShareOneBudget(t *testing.T) {
	pool := fdlimit.NewPool(256) // 192 for the devices, 64 kept back
	first := pool.Share(0)
	t.Cleanup(first.Close)
	alone := first.Limit()
	second := pool.Share(0)
	t.Cleanup(second.Close)
	require.Less(t, second.Limit(), alone, "the second device gets less than the first had alone")

	before := openFds(t)
	for _, share := range []*fdlimit.Share{first, second} {
		r := newRigOver(t, Options{}, hostfs.NewExportsWithin(discardLogger(), share))
		r.export(t, "e1", false, map[string]string{"f": "data"})
		r.initSession(t)
		n, errno := openUntilRefused(t, r, r.walk(t, "e1", "f"), pool.Total())
		require.Equal(t, syscall.ENFILE, errno, "after %d opens", n)
		require.LessOrEqual(t, share.Held(), share.Limit())
	}
	held := openFds(t) - before
	t.Logf("alone %d, each of two %d, total %d, held %d (%d + %d)", alone, second.Limit(), pool.Total(), held, first.Held(), second.Held())
	require.LessOrEqual(t, pool.Used(), pool.Total())
	require.LessOrEqual(t, first.Held()+second.Held(), pool.Total())
	// Besides the budget: each export's root, opened when the host
	// registers it (not the guest's doing).
	require.LessOrEqual(t, held, pool.Total()+2)
}

// TestLookupOfAHeldNameWithTheBudgetSpent: with the budget spent, a
// LOOKUP of a name whose node the guest holds (its kernel revalidating an
// entry, every second on an uncached device) is still answered, from the
// node it has; only a name that needs a new node gets ENFILE.
func TestLookupOfAHeldNameWithTheBudgetSpent(t *testing.T) {
	const budget = 8
	r := newBudgetRig(t, Options{}, budget)
	r.export(t, "e1", false, map[string]string{"f": "data", "g": "other"})
	r.initSession(t)
	e1 := r.walk(t, "e1")
	f, errno := r.lookup(t, e1, "f")
	require.Zero(t, errno)
	n, errno := openUntilRefused(t, r, f.NodeId, budget)
	require.Equal(t, syscall.ENFILE, errno, "the budget is spent after %d opens", n)

	again, errno := r.lookup(t, e1, "f")
	require.Zero(t, errno, "a LOOKUP of a held name")
	require.Equal(t, f.NodeId, again.NodeId)
	require.Equal(t, f.Attr.Ino, again.Attr.Ino)
	_, errno = r.lookup(t, e1, "g")
	require.Equal(t, syscall.ENFILE, errno, "a name that needs a new node")
	r.forget(t, f.NodeId, 1)
	_, errno = r.getattr(t, f.NodeId)
	require.Zero(t, errno, "the held-name LOOKUP counted: one FORGET leaves one lookup")
}
