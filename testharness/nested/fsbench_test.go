package nested

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsrun"
)

// TestNestedFSBench runs guestboot/fsrun's TestFSBench inside the outer
// guest:
// the test guest runs the file-sharing workloads (sequential write and
// read, random reads, a tree walk, git status, python3's start) on our VMM
// with our virtio-fs and our virtio-9p devices, on qemu microvm with its
// virtio-9p and with vhost-user-fs and virtiofsd, all sharing the same
// directory of the outer guest, and the sequential and random I/O on a raw
// disk image with our virtio-blk device and qemu's, interleaved. It logs
// every figure, the medians, our speed-ups over the others (virtio-fs's in
// file sharing, virtio-blk's over qemu's) and the targets. Figures
// are reported, not asserted: it fails only when a guest other than qemu +
// virtiofsd's reports an error or no figure.
//
// COWORK_VMM_FS_BENCH=full (make fs-bench) takes the full sizes; `make
// test` runs the small ones (guestboot.FSSizesCI). GUESTBOOT_FS_SYSTEMS
// (fsrun.EnvFSSystems) selects systems: ours-blk,qemu-blk for the block
// device alone (make blk-bench).
func TestNestedFSBench(t *testing.T) {
	sizes, err := guestboot.FSSizesFromEnv()
	require.NoError(t, err)
	timeout := 20 * time.Minute
	if sizes.Runs > 1 {
		timeout = time.Duration(sizes.Runs) * 20 * time.Minute
	}
	res := runTestGuestTests(t, "github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsrun", "^TestFSBench$", timeout,
		guestboot.EnvFSBench+"="+os.Getenv(guestboot.EnvFSBench),
		fsrun.EnvFSGoMaxProcs+"="+os.Getenv(fsrun.EnvFSGoMaxProcs),
		fsrun.EnvFSSystems+"="+os.Getenv(fsrun.EnvFSSystems))

	var figs []guestboot.FSFigure
	sc := bufio.NewScanner(strings.NewReader(res.Output))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if f, ok := guestboot.ParseFSFigureLine(sc.Text()); ok {
			figs = append(figs, f)
		}
		if system, reason, ok := guestboot.ParseFSSkipLine(sc.Text()); ok {
			t.Logf("%s not measured: %s", guestboot.FSSystemLabel(system), reason)
		}
	}
	samples := guestboot.CollectFS(figs)
	for _, system := range []string{guestboot.FSOursVirtioFS, guestboot.FSOursNineP, guestboot.FSQemuNineP, guestboot.FSOursBlk, guestboot.FSQemuBlk} {
		if !fsrun.Selected(system) {
			continue
		}
		require.Contains(t, samples.Systems(), system, "%s reported no figure", guestboot.FSSystemLabel(system))
	}
	for _, line := range FSSummary(samples) {
		t.Log(line)
	}
}

// FSSummary formats the medians of samples, suite by suite a line per
// metric, then our speed-ups, then the targets.
func FSSummary(samples guestboot.FSSamples) []string {
	var lines []string
	speedups := samples.Speedups()
	for _, suite := range guestboot.FSSuites {
		for _, m := range fsbench.Metrics {
			var cells []string
			for _, system := range suite.Systems {
				desc, ok := samples.DescribeMedian(system, m.ID)
				if !ok {
					continue
				}
				cells = append(cells, system+" "+desc)
			}
			if len(cells) > 0 {
				lines = append(lines, fmt.Sprintf("%s median %s: %s", suite.ID, m.Label, strings.Join(cells, "; ")))
			}
		}
		for _, m := range fsbench.Metrics {
			var cells []string
			for _, s := range speedups {
				if s.Metric == m.ID && s.System == suite.Ours {
					cells = append(cells, fmt.Sprintf("%.2f× vs %s", s.Speedup, s.Versus))
				}
			}
			if len(cells) > 0 {
				lines = append(lines, fmt.Sprintf("%s %s speed-up, %s: %s", suite.ID, suite.Short, m.Label, strings.Join(cells, ", ")))
			}
		}
	}
	for _, target := range guestboot.FSTargets {
		i := slices.IndexFunc(speedups, func(s guestboot.FSSpeedup) bool { return s.Metric == target.Metric && s.Versus == target.Versus })
		if i < 0 {
			lines = append(lines, fmt.Sprintf("fs target %s: virtio-fs ≥ %.0f× %s: not measured", target.Metric, target.Min, target.Versus))
			continue
		}
		verdict := "met"
		if speedups[i].Speedup < target.Min {
			verdict = "NOT met"
		}
		lines = append(lines, fmt.Sprintf("fs target %s: virtio-fs ≥ %.0f× %s: %.2f×, %s", target.Metric, target.Min, target.Versus, speedups[i].Speedup, verdict))
	}
	return lines
}
