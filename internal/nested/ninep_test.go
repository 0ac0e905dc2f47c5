package nested

import (
	"bufio"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot"
)

// TestNested9pThroughput runs guestboot's TestThroughput9p inside the outer
// guest: the test guest writes and reads a file over 9p on our VMM and on
// qemu microvm's virtio-9p, both exporting the same directory of the outer
// guest, three runs each, interleaved. It logs every run and the medians
// and ratios ours/qemu. Throughput is reported, not asserted: it fails
// only when a guest reports an error or no figure.
func TestNested9pThroughput(t *testing.T) {
	res := runGuestbootTest(t, "^TestThroughput9p$", 10*time.Minute,
		guestboot.EnvNinePMiB+"="+strconv.Itoa(guestboot.DefaultNinePMiB))

	runs := map[string][]guestboot.NinePFigure{}
	sc := bufio.NewScanner(strings.NewReader(res.Output))
	for sc.Scan() {
		if f, ok := guestboot.ParseNinePFigureLine(sc.Text()); ok {
			runs[f.VMM] = append(runs[f.VMM], f)
		}
	}
	ours, qemu := runs["cowork-vmm"], runs["qemu-microvm"]
	require.NotEmpty(t, ours, "our VMM reported no 9p figure")
	require.NotEmpty(t, qemu, "qemu microvm reported no 9p figure")
	for _, vmm := range []string{"cowork-vmm", "qemu-microvm"} {
		for _, f := range runs[vmm] {
			t.Logf("%s run %d: write %.1f MB/s (%v), read %.1f MB/s (%v), %d MiB, msize %d; outer guest busy %v of %v from ready to result",
				vmm, f.Run, f.Result.WriteMBps(), f.Result.Write.Round(time.Millisecond), f.Result.ReadMBps(), f.Result.Read.Round(time.Millisecond),
				f.Result.Bytes>>20, f.Result.Msize, f.Busy, f.Window)
		}
	}
	oursWrite, oursRead := medianMBps(ours)
	qemuWrite, qemuRead := medianMBps(qemu)
	t.Logf("9p medians (%d and %d runs): cowork-vmm write %.1f MB/s read %.1f MB/s; qemu microvm write %.1f MB/s read %.1f MB/s; ratio ours/qemu write %.2f read %.2f",
		len(ours), len(qemu), oursWrite, oursRead, qemuWrite, qemuRead, oursWrite/qemuWrite, oursRead/qemuRead)
}

// medianMBps returns the median write and read throughputs of runs.
func medianMBps(runs []guestboot.NinePFigure) (write, read float64) {
	w := make([]float64, 0, len(runs))
	r := make([]float64, 0, len(runs))
	for _, f := range runs {
		w = append(w, f.Result.WriteMBps())
		r = append(r, f.Result.ReadMBps())
	}
	return median(w), median(r)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func TestMedian(t *testing.T) {
	require.Zero(t, median(nil))
	require.Equal(t, 2.0, median([]float64{3, 1, 2}))
	require.Equal(t, 2.5, median([]float64{4, 1, 3, 2}))
}
