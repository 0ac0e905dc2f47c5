package virtiofs

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/p9/fs"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
)

// newBudgetRig is a rig whose exports hold at most budget descriptors.
func newBudgetRig(t *testing.T, opts Options, budget int) *rig {
	share := fdlimit.NewPool(1 << 20).Share(budget)
	t.Cleanup(share.Close)
	return newRigOver(t, opts, fs.NewExportsWithin(discardLogger(), share))
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
