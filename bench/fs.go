package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsrun"
)

// The file-sharing benchmark is guestboot/fsrun's (FSBench): the same test guest
// and workloads as testharness/nested's TestNestedFSBench, its figures
// summarised here as the report's "fs" section and, for the block-device
// systems (the same workloads on a raw disk), its "blk" section.

// FSReport is a section of the report for one of guestboot.FSSuites: file
// sharing, or the block device.
type FSReport struct {
	ID    string `json:"id"`
	Title string `json:"title"`
	// Ours is the system the others are compared with, Short its name in
	// the comparisons.
	Ours     string             `json:"ours"`
	Short    string             `json:"short"`
	Sizes    string             `json:"sizes"`
	Runs     int                `json:"runs"`
	Systems  []FSSystemReport   `json:"systems"`
	Speedups []FSSpeedupReport  `json:"speedups,omitempty"`
	Targets  []FSTargetReport   `json:"targets,omitempty"`
	Notes    []string           `json:"notes,omitempty"`
	Metrics  []FSMetricOverview `json:"metrics"`
}

// FSMetricOverview names a metric of the section, in report order.
type FSMetricOverview struct {
	ID    string `json:"id"`
	Label string `json:"label"`
}

// FSSystemReport is one system's figures.
type FSSystemReport struct {
	ID       string           `json:"id"`
	Label    string           `json:"label"`
	Metrics  []FSMetricReport `json:"metrics,omitempty"`
	Failures []string         `json:"failures,omitempty"`
	// Skipped says why the system did not run here.
	Skipped string `json:"skipped,omitempty"`
}

// FSMetricReport is one metric's samples on one system, in milliseconds,
// with what they are the time of (bytes, reads or files) and, for the
// throughputs, the median in MB/s.
type FSMetricReport struct {
	ID        string    `json:"id"`
	Label     string    `json:"label"`
	Count     int64     `json:"count,omitempty"`
	CountUnit string    `json:"count_unit,omitempty"`
	SamplesMS []float64 `json:"samples_ms"`
	MinMS     float64   `json:"min_ms"`
	MedianMS  float64   `json:"median_ms"`
	MaxMS     float64   `json:"max_ms"`
	MedianMBs float64   `json:"median_mb_per_s,omitempty"`
}

// FSSpeedupReport is how many times faster our System is than Versus on
// Metric (median times, the other's over ours: above 1, ours is faster;
// for a throughput, ours in MB/s over the other's).
type FSSpeedupReport struct {
	Metric  string  `json:"metric"`
	System  string  `json:"system"`
	Versus  string  `json:"versus"`
	Speedup float64 `json:"speedup"`
}

// FSTargetReport is one of issue #16's targets and whether it was met.
type FSTargetReport struct {
	Metric  string  `json:"metric"`
	Versus  string  `json:"versus"`
	Min     float64 `json:"min_speedup"`
	Speedup float64 `json:"speedup,omitempty"`
	Met     bool    `json:"met"`
	// Measured is false when either side has no figure.
	Measured bool `json:"measured"`
}

// fsResults accumulates the runs of every suite.
type fsResults struct {
	sizes    guestboot.FSSizes
	figures  []guestboot.FSFigure
	failures map[string][]string
	skipped  map[string]string
	notes    map[string][]string // by suite id
}

func newFSResults(sizes guestboot.FSSizes) *fsResults {
	return &fsResults{sizes: sizes, failures: map[string][]string{}, skipped: map[string]string{}, notes: map[string][]string{}}
}

// report summarises the runs of suite's systems; nil when none ran or
// was skipped.
func (r *fsResults) report(suite guestboot.FSSuite) *FSReport {
	samples := guestboot.CollectFS(r.figures)
	rep := &FSReport{ID: suite.ID, Title: suite.Title, Ours: suite.Ours, Short: suite.Short,
		Sizes: suite.Sizes(r.sizes), Runs: r.sizes.Runs, Notes: r.notes[suite.ID]}
	for _, m := range fsbench.Metrics {
		rep.Metrics = append(rep.Metrics, FSMetricOverview{ID: m.ID, Label: m.Label})
	}
	for _, id := range suite.Systems {
		sr := FSSystemReport{ID: id, Label: guestboot.FSSystemLabel(id), Failures: r.failures[id], Skipped: r.skipped[id]}
		for _, m := range fsbench.Metrics {
			times := samples.Times(id, m.ID)
			if len(times) == 0 {
				continue
			}
			sum := Summarize(times)
			mr := FSMetricReport{ID: m.ID, Label: m.Label, Count: samples.Count(id, m.ID), CountUnit: m.CountKey,
				MinMS: ms(sum.Min), MedianMS: ms(sum.Median), MaxMS: ms(sum.Max)}
			for _, d := range times {
				mr.SamplesMS = append(mr.SamplesMS, ms(d))
			}
			if m.Unit == fsbench.UnitThroughput && sum.Median > 0 {
				mr.MedianMBs = math.Round(float64(mr.Count)/sum.Median.Seconds()/1e6*10) / 10
			}
			sr.Metrics = append(sr.Metrics, mr)
		}
		if len(sr.Metrics) > 0 || sr.Failures != nil || sr.Skipped != "" {
			rep.Systems = append(rep.Systems, sr)
		}
	}
	if len(rep.Systems) == 0 {
		return nil
	}
	for _, s := range samples.Speedups() {
		if s.System == suite.Ours {
			rep.Speedups = append(rep.Speedups, FSSpeedupReport{Metric: s.Metric, System: s.System, Versus: s.Versus, Speedup: roundRatio(s.Speedup)})
		}
	}
	for _, t := range guestboot.FSTargets {
		if !slices.Contains(suite.Systems, t.Versus) {
			continue
		}
		tr := FSTargetReport{Metric: t.Metric, Versus: t.Versus, Min: t.Min}
		if v, ok := rep.speedup(t.Metric, t.Versus); ok {
			tr.Measured, tr.Speedup, tr.Met = true, v, v >= t.Min
		}
		rep.Targets = append(rep.Targets, tr)
	}
	return rep
}

func (r *FSReport) speedup(metric, versus string) (float64, bool) {
	for _, s := range r.Speedups {
		if s.Metric == metric && s.Versus == versus {
			return s.Speedup, true
		}
	}
	return 0, false
}

func (s FSSystemReport) metric(id string) *FSMetricReport {
	for i := range s.Metrics {
		if s.Metrics[i].ID == id {
			return &s.Metrics[i]
		}
	}
	return nil
}

// fsCell formats one metric of one system for the table.
func fsCell(m FSMetricReport) string {
	spread := fmt.Sprintf("%s–%s", fmtMS(m.MinMS), fmtMS(m.MaxMS))
	metric, _ := fsbench.MetricByID(m.ID)
	switch {
	case metric.Unit == fsbench.UnitThroughput && m.MedianMBs > 0:
		return fmt.Sprintf("%.1f MB/s (%s; %s)", m.MedianMBs, fmtMS(m.MedianMS), spread)
	case metric.Unit == fsbench.UnitPerOp && m.Count > 0:
		return fmt.Sprintf("%s/read (%s; %s)", fmtMS(m.MedianMS/float64(m.Count)), fmtMS(m.MedianMS), spread)
	}
	return fmt.Sprintf("%s (%s)", fmtMS(m.MedianMS), spread)
}

// writeFSMarkdown writes a section's table: a row per metric, a column
// per system, then our speed-up over each other system; then the targets,
// failures, skips and notes.
func writeFSMarkdown(b *strings.Builder, r *FSReport) {
	fmt.Fprintf(b, "### %s: %s\n\n", r.Title, r.Sizes)
	fmt.Fprintf(b, "Each cell: median (min–max). Speed-up: the other system's median time over %s's, for a throughput %s's MB/s over the other's (above 1: %s is faster).\n\n",
		guestboot.FSSystemLabel(r.Ours), r.Short, r.Short)
	var measured []FSSystemReport
	for _, s := range r.Systems {
		if len(s.Metrics) > 0 {
			measured = append(measured, s)
		}
	}
	header := []string{"workload"}
	for _, s := range measured {
		header = append(header, s.Label)
	}
	var versus []string
	for _, s := range measured {
		if s.ID != r.Ours {
			versus = append(versus, s.ID)
			header = append(header, r.Short+" speed-up vs "+s.ID)
		}
	}
	writeRow(b, header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---:"
	}
	sep[0] = "---"
	writeRow(b, sep)
	for _, m := range r.Metrics {
		row := []string{m.Label}
		any := false
		for _, s := range measured {
			mr := s.metric(m.ID)
			if mr == nil {
				row = append(row, "—")
				continue
			}
			any = true
			row = append(row, fsCell(*mr))
		}
		for _, v := range versus {
			s, ok := r.speedup(m.ID, v)
			row = append(row, fmtRatio(s, ok))
		}
		if any {
			writeRow(b, row)
		}
	}
	b.WriteString("\n")
	for _, t := range r.Targets {
		label := t.Metric
		if m, ok := fsbench.MetricByID(t.Metric); ok {
			label = m.Label
		}
		fmt.Fprintf(b, "- target: %s, %s ≥ %g× %s: %s\n", label, r.Short, t.Min, t.Versus, verdict(t.Measured, t.Met, t.Speedup))
	}
	for _, s := range r.Systems {
		if s.Skipped != "" {
			fmt.Fprintf(b, "- %s not measured: %s\n", s.Label, s.Skipped)
		}
		for _, f := range s.Failures {
			fmt.Fprintf(b, "- %s failed: %s\n", s.Label, f)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(b, "- %s\n", n)
	}
	b.WriteString("\n")
}

// fsSizes are the sizes opts select, with its run count.
func fsSizes(opts Options) (guestboot.FSSizes, error) {
	var s guestboot.FSSizes
	switch opts.FSSizes {
	case "", "full":
		s = guestboot.FSSizesFull
	case "ci":
		s = guestboot.FSSizesCI
	default:
		// Sizes of one's own: "mib=32,rand=1000,tree=20x50" (the rest
		// from the ci sizes; --fs-runs gives the runs).
		var err error
		if s, err = guestboot.ParseFSSizes(opts.FSSizes); err != nil || strings.Contains(opts.FSSizes, "runs=") {
			return s, fmt.Errorf(`--fs-sizes %q: want "full", "ci" or mib=N,rand=N,tree=DIRSxFILES (any of them; --fs-runs gives the runs)`, opts.FSSizes)
		}
	}
	s.Runs = opts.FSRuns
	return s, nil
}

// measureFS runs the file-sharing and block-device benchmarks: FSRuns
// runs of every system, interleaved. It needs our VMM (the kvm backend)
// and the test guest's initramfs (--fs-initrd, else built here with the go
// tool).
func (b *benchRun) measureFS(ctx context.Context) error {
	if b.opts.FSRuns <= 0 {
		return nil
	}
	sizes, err := fsSizes(b.opts)
	if err != nil {
		return err
	}
	if b.backend != "kvm" {
		b.note("no file-sharing or block-device bench: it boots the test guest on our VMM, which the " + b.backend + " backend does not use")
		return nil
	}
	initrd := b.opts.FSInitrd
	if initrd == "" {
		initrd = filepath.Join(b.work, "fs-initrd.cpio.gz")
		b.show.status("file sharing: building the test guest's initramfs")
		if err := guestboot.BuildInitramfs(ctx, initrd); err != nil {
			b.note("no file-sharing or block-device bench: give --fs-initrd (the test guest's initramfs, built from the source tree): " + firstLine(err.Error()))
			return nil
		}
	}
	dir := filepath.Join(b.work, "fs-share")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b.fs = newFSResults(sizes)
	fb := &fsrun.FSBench{Kernel: b.vmlinux, Initrd: initrd, Dir: dir, Root: "/", Sizes: sizes, MemMiB: b.opts.MemMiB, Qemu: b.qemu, NoQemu: b.qemu == ""}
	var work *fsWork
	if b.meter != nil {
		work = newFSWork(*b.meter)
		fb.OnMark = work.onMark
	}
	b.show.status("file sharing: making the tree of %d files", sizes.Dirs*sizes.FilesPerDir)
	notes, err := fb.Prepare(ctx)
	if err != nil {
		return fmt.Errorf("file-sharing bench: %w", err)
	}
	b.fs.notes["fs"] = append(notes, "the shared directory is uncached (a session's mounts: cowork-vmm's devices uncached, 9p cache=none, virtiofsd cache=auto); the host root for git and python is cached (virtio-fs cached, 9p cache=loose, virtiofsd cache=always)")
	b.fs.notes["blk"] = []string{"both devices serve the same sparse raw image file, made afresh for each run; the guest writes the whole disk through /dev/vda's page cache and fsyncs (timed together), drops its caches and reads it back, checking every block. " +
		"qemu runs with cache=writeback,aio=threads, the like of our device: both pread/pwrite the file through the host's page cache (no O_DIRECT) and a flush is fdatasync"}
	var systems []string
	for _, s := range guestboot.FSSystems {
		if why := fb.Unavailable(s); why != "" {
			b.fs.skipped[s] = why
			continue
		}
		systems = append(systems, s)
	}
	for run := 1; run <= sizes.Runs; run++ {
		for _, system := range systems {
			if b.fs.skipped[system] != "" {
				continue
			}
			b.show.status("run %d/%d guest I/O, %s: workloads", run, sizes.Runs, system)
			start := time.Now()
			res, err := fb.Run(ctx, system, run)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			b.recordFSRun(system, run, res, err, work)
			if err == nil {
				b.show.line("run %d guest I/O %s: %v", run, system, time.Since(start).Round(time.Second))
			}
		}
	}
	return nil
}

// recordFSRun records one run of system: its figures and its work, those
// of the workloads it finished when it failed (a guest that did not end in
// time), with the failure.
func (b *benchRun) recordFSRun(system string, run int, res fsrun.FSRun, err error, work *fsWork) {
	var took map[string]Work
	if work != nil {
		took = work.take()
	}
	switch {
	case err != nil && fsrun.IsUnavailable(err):
		b.fs.skipped[system] = firstLine(err.Error())
		return
	case err != nil:
		b.fs.failures[system] = append(b.fs.failures[system], fmt.Sprintf("run %d: %s", run, firstLine(err.Error())))
		b.show.line("run %d guest I/O %s failed: %v", run, system, err)
	}
	for _, f := range res.Figures() {
		b.fs.figures = append(b.fs.figures, f)
		if f.Result.Err != "" {
			b.fs.failures[system] = append(b.fs.failures[system], fmt.Sprintf("run %d, %s: %s", run, f.Result.Workload, f.Result.Err))
		}
	}
	b.addFSWork(system, took, res.Results)
}
