package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

// sampleFS is a file-sharing bench of three systems, 3 runs each, the
// fourth skipped, with one failed workload; and the block-device systems,
// ours twice as fast as qemu's.
func sampleFS() *fsResults {
	r := newFSResults(guestboot.FSSizes{Runs: 3, MiB: 1, RandReads: 100, Dirs: 2, FilesPerDir: 50})
	scale := map[string]int64{guestboot.FSOursVirtioFS: 1, guestboot.FSOursNineP: 6, guestboot.FSQemuNineP: 3}
	for run := 1; run <= 3; run++ {
		for _, system := range []string{guestboot.FSOursVirtioFS, guestboot.FSOursNineP, guestboot.FSQemuNineP} {
			k := scale[system] * int64(run+9) // runs 10, 11, 12 ms × scale
			for _, res := range []fsbench.Result{
				{Workload: fsbench.WorkloadSeq, Values: map[string]int64{"bytes": 1 << 20, "write_ns": 2 * k * 1e6, "read_ns": k * 1e6}},
				{Workload: fsbench.WorkloadRand, Values: map[string]int64{"reads": 100, "size": 4096, "ns": k * 1e6}},
				{Workload: fsbench.WorkloadWalk, Values: map[string]int64{"dirs": 2, "files": 100, "cold_ns": k * 1e6, "warm_ns": k * 1e6}},
				{Workload: fsbench.WorkloadPython, Err: "no python3"},
			} {
				r.figures = append(r.figures, guestboot.FSFigure{System: system, Run: run, Result: res})
			}
		}
	}
	for run := 1; run <= 3; run++ {
		for system, k := range map[string]int64{guestboot.FSOursBlk: 10, guestboot.FSQemuBlk: 20} {
			k += int64(run) // 11, 12, 13 ms; 21, 22, 23 ms
			r.figures = append(r.figures, guestboot.FSFigure{System: system, Run: run, Result: fsbench.Result{Workload: fsbench.WorkloadSeq,
				Values: map[string]int64{"bytes": 1 << 20, "write_ns": 2 * k * 1e6, "read_ns": k * 1e6}}})
		}
	}
	r.failures[guestboot.FSOursNineP] = []string{"run 2, python: no python3"}
	r.skipped[guestboot.FSQemuVirtiofsd] = "no virtiofsd"
	r.notes["fs"] = []string{"no git workload: no git"}
	r.notes["blk"] = []string{"qemu cache=writeback"}
	return r
}

func sampleReportWithFS() Report {
	rep := sampleReport()
	r := sampleFS()
	rep.FS, rep.Blk = r.report(guestboot.FSSuiteFS), r.report(guestboot.FSSuiteBlk)
	return rep
}

func TestFSReportSummaries(t *testing.T) {
	fs := sampleFS().report(guestboot.FSSuiteFS)
	require.Len(t, fs.Systems, 4, "three measured, one skipped")
	ours := fs.Systems[0]
	assert.Equal(t, guestboot.FSOursVirtioFS, ours.ID)
	read := ours.metric("seq_read")
	require.NotNil(t, read)
	assert.Equal(t, []float64{10, 11, 12}, read.SamplesMS)
	assert.Equal(t, 11.0, read.MedianMS)
	assert.InDelta(t, 95.3, read.MedianMBs, 0.05) // 1 MiB in 11 ms
	assert.Nil(t, ours.metric("python_cold"), "a failed workload has no figure")
	assert.Equal(t, "no virtiofsd", fs.Systems[3].Skipped)
	assert.Empty(t, fs.Systems[3].Metrics)

	s, ok := fs.speedup("walk_cold", guestboot.FSOursNineP)
	require.True(t, ok)
	assert.Equal(t, 6.0, s)
	s, ok = fs.speedup("seq_read", guestboot.FSQemuNineP)
	require.True(t, ok)
	assert.Equal(t, 3.0, s)
	require.Len(t, fs.Targets, len(guestboot.FSTargets))
	for _, target := range fs.Targets {
		assert.True(t, target.Measured, target.Metric)
		assert.True(t, target.Met, target.Metric)
	}
}

func TestFSReportJSONAndMarkdown(t *testing.T) {
	rep := sampleReportWithFS()
	var j bytes.Buffer
	require.NoError(t, WriteJSON(&j, rep))
	var back Report
	require.NoError(t, json.Unmarshal(j.Bytes(), &back))
	assert.Equal(t, rep, back)
	assert.Contains(t, j.String(), `"median_mb_per_s": 95.3`)

	var b bytes.Buffer
	require.NoError(t, WriteMarkdown(&b, rep))
	md := b.String()
	assert.Contains(t, md, "### File sharing: 3 run(s), 1 MiB file")
	assert.Contains(t, md, "| workload | cowork-vmm virtio-fs | cowork-vmm virtio-9p | qemu microvm virtio-9p | virtio-fs speed-up vs ours-9p | virtio-fs speed-up vs qemu-9p |")
	assert.Contains(t, md, "| sequential read, cache dropped | 95.3 MB/s (11.0 ms; 10.0 ms–12.0 ms) | 15.9 MB/s (66.0 ms; 60.0 ms–72.0 ms) | 31.8 MB/s (33.0 ms; 30.0 ms–36.0 ms) | 6.00× | 3.00× |")
	assert.Contains(t, md, "| 4 KiB random reads, cache dropped | 0.11 ms/read (11.0 ms; 10.0 ms–12.0 ms) |")
	assert.NotContains(t, md, "| python3", "no row without a figure")
	assert.Contains(t, md, "- target: sequential read, cache dropped, virtio-fs ≥ 2× qemu-9p: 3.00×, met")
	assert.Contains(t, md, "- qemu microvm vhost-user-fs + virtiofsd not measured: no virtiofsd")
	assert.Contains(t, md, "- cowork-vmm virtio-9p failed: run 2, python: no python3")
	assert.Contains(t, md, "- no git workload: no git")
	assert.Less(t, strings.Index(md, "| phase |"), strings.Index(md, "### File sharing"), "after the boot table")
	blkReportJSONAndMarkdown(t, j.String(), md)
}

func TestSVGHasTheFSPanel(t *testing.T) {
	rep := sampleReportWithFS()
	var b bytes.Buffer
	require.NoError(t, WriteSVG(&b, rep))
	bars := svgBars(t, bytes.NewReader(b.Bytes()))
	var want [][2]string
	for _, p := range Phases {
		for _, s := range rep.Systems {
			if s.phase(p.ID) != nil {
				want = append(want, [2]string{p.ID, s.ID})
			}
		}
	}
	for _, section := range []*FSReport{rep.FS, rep.Blk} {
		for _, m := range section.Metrics {
			for _, s := range section.Systems {
				if s.metric(m.ID) != nil {
					want = append(want, [2]string{m.ID, s.ID})
				}
			}
		}
	}
	assert.Equal(t, want, bars)
	svg := b.String()
	assert.Contains(t, svg, ">File sharing: 3 run(s)")
	assert.Contains(t, svg, ">cowork-vmm virtio-fs</text>", "legend entry")
	assert.NotContains(t, svg, ">qemu microvm vhost-user-fs + virtiofsd</text>", "no legend entry for a system without figures")
	assert.Contains(t, svg, ">95.3 MB/s</text>")
	assert.Contains(t, svg, ">Block device: 3 run(s), 1 MiB written and read on a raw 1 MiB disk image")
	assert.Contains(t, svg, ">cowork-vmm virtio-blk</text>", "legend entry")
	assert.Less(t, strings.Index(svg, ">File sharing: "), strings.Index(svg, ">Block device: "))
}

func TestBlkReport(t *testing.T) {
	r := sampleFS()
	blk := r.report(guestboot.FSSuiteBlk)
	require.NotNil(t, blk)
	assert.Equal(t, "blk", blk.ID)
	assert.Equal(t, guestboot.FSOursBlk, blk.Ours)
	require.Len(t, blk.Systems, 2, "only the block-device systems")
	assert.Equal(t, guestboot.FSOursBlk, blk.Systems[0].ID)
	assert.InDelta(t, 87.4, blk.Systems[0].metric("seq_read").MedianMBs, 0.05) // 1 MiB in 12 ms
	assert.Empty(t, blk.Targets, "issue #16's targets are file sharing's")
	assert.Equal(t, []string{"qemu cache=writeback"}, blk.Notes)
	for _, s := range blk.Speedups {
		assert.Equal(t, guestboot.FSOursBlk, s.System)
		assert.Equal(t, guestboot.FSQemuBlk, s.Versus)
	}
	v, ok := blk.speedup("seq_write", guestboot.FSQemuBlk)
	require.True(t, ok)
	assert.Equal(t, 1.833, v) // 44 ms over 24 ms
	fs := r.report(guestboot.FSSuiteFS)
	for _, s := range fs.Speedups {
		assert.Equal(t, guestboot.FSOursVirtioFS, s.System, "no comparison across suites")
	}

	assert.Nil(t, newFSResults(guestboot.FSSizesCI).report(guestboot.FSSuiteBlk), "no section without a system")
}

// blkReportJSONAndMarkdown checks the block-device section of
// TestFSReportJSONAndMarkdown's report.
func blkReportJSONAndMarkdown(t *testing.T, report, md string) {
	t.Helper()
	assert.Contains(t, report, `"blk": {`)
	assert.Contains(t, report, `"ours": "ours-blk"`)
	assert.Contains(t, md, "### Block device: 3 run(s), 1 MiB written and read on a raw 1 MiB disk image, 100 random 4 KiB reads")
	assert.Contains(t, md, "| workload | cowork-vmm virtio-blk | qemu microvm virtio-blk | virtio-blk speed-up vs qemu-blk |")
	assert.Contains(t, md, "| sequential write + fsync | 43.7 MB/s (24.0 ms; 22.0 ms–26.0 ms) | 23.8 MB/s (44.0 ms; 42.0 ms–46.0 ms) | 1.83× |")
	assert.Contains(t, md, "- qemu cache=writeback")
	assert.NotContains(t, md, "virtio-blk speed-up vs ours-9p")
	assert.Less(t, strings.Index(md, "### File sharing"), strings.Index(md, "### Block device"))
}

func TestFSSizesAndFlags(t *testing.T) {
	s, err := fsSizes(Options{FSRuns: 2})
	require.NoError(t, err)
	assert.Equal(t, guestboot.FSSizesFull.MiB, s.MiB)
	assert.Equal(t, 2, s.Runs)
	s, err = fsSizes(Options{FSRuns: 1, FSSizes: "ci"})
	require.NoError(t, err)
	assert.Equal(t, guestboot.FSSizesCI.Dirs, s.Dirs)
	_, err = fsSizes(Options{FSSizes: "huge"})
	require.Error(t, err)

	o, err := parseFlags("--fs-runs", "0")
	require.NoError(t, err)
	assert.Zero(t, o.FSRuns)
	o, err = parseFlags()
	require.NoError(t, err)
	assert.Equal(t, DefaultFSRuns, o.FSRuns)
	_, err = parseFlags("--fs-sizes", "huge")
	require.Error(t, err)
	_, err = parseFlags("--fs-runs", "-1")
	require.Error(t, err)
}
