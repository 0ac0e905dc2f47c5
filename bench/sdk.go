package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsrun"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/sdkturn"
	"github.com/cowork-vmm/cowork-vmm/testharness/sdkcache"
)

// The real Claude Code CLI's turns (package sdkturn): the test guest's SDK
// mode on our VMM (virtio-fs, shared as the file-sharing bench's "ours
// virtio-fs" shares) and on qemu microvm with virtiofsd, and the same
// turns natively on this machine, all running one copy of the CLI from
// one directory against a fake API on their own loopback. The report's
// "sdk" section.

// SDK systems: ours and qemu + virtiofsd are guestboot's file-sharing
// systems; SDKNative is the CLI run here, outside any guest.
const SDKNative = "native"

// sdkSystems are the systems, in the order of a run; ours first.
var sdkSystems = []string{guestboot.FSOursVirtioFS, guestboot.FSQemuVirtiofsd, SDKNative}

// Defaults of the SDK flags.
const (
	DefaultSDKRuns = 3
	// DefaultSDKMemMiB is the test guest's memory for the turns: the CLI
	// wants a few hundred MiB besides the guest's page cache of it.
	DefaultSDKMemMiB = 1024
	// sdkBootTimeout bounds one boot: its four turns, each bounded by
	// sdkturn.DefaultTimeout, and the boot around them, so that a boot
	// whose turns all time out still reports why.
	sdkBootTimeout = 4*sdkturn.DefaultTimeout + 5*time.Minute
)

// sdkSystemLabel is a system's name for people.
func sdkSystemLabel(id string) string {
	if id == SDKNative {
		return "native (same machine, no VM)"
	}
	return guestboot.FSSystemLabel(id)
}

// sdkMetric is one figure of one turn.
type sdkMetric struct {
	ID, Label string
	Turn      string // its sdkturn.Turn's ID
	Key       string // sdkturn.KeyFirstByte or KeyExit
}

// sdkMetrics are the report's rows, in order: each turn's first byte,
// then its exit.
var sdkMetrics = func() []sdkMetric {
	var out []sdkMetric
	for _, t := range sdkturn.Turns {
		what := "claude -p"
		if t.Mode == sdkturn.ModeStream {
			what = "stream-json turn"
		}
		when := "warm"
		if t.Cold {
			when = "cold"
		}
		out = append(out,
			sdkMetric{ID: t.ID + "_first_byte", Label: fmt.Sprintf("%s → first byte (%s)", what, when), Turn: t.ID, Key: sdkturn.KeyFirstByte},
			sdkMetric{ID: t.ID + "_exit", Label: fmt.Sprintf("%s → exit (%s)", what, when), Turn: t.ID, Key: sdkturn.KeyExit})
	}
	return out
}()

// SDKReport is the report's section on the real CLI's turns.
type SDKReport struct {
	// Version is the CLI's; Runs the boots (natively: rounds) per system.
	Version string `json:"version,omitempty"`
	Runs    int    `json:"runs"`
	// Skipped says why nothing was measured.
	Skipped string             `json:"skipped,omitempty"`
	Systems []SDKSystemReport  `json:"systems,omitempty"`
	Ratios  []RatioReport      `json:"ratios,omitempty"`
	Targets []BootTargetReport `json:"targets,omitempty"`
	Work    []SDKBootWork      `json:"work,omitempty"`
	Notes   []string           `json:"notes,omitempty"`
	Metrics []FSMetricOverview `json:"metrics,omitempty"`
}

// SDKSystemReport is one system's figures: a PhaseReport per metric.
type SDKSystemReport struct {
	ID       string        `json:"id"`
	Label    string        `json:"label"`
	Metrics  []PhaseReport `json:"metrics,omitempty"`
	Failures []string      `json:"failures,omitempty"`
	Skipped  string        `json:"skipped,omitempty"`
}

// SDKBootWork is what one boot of the test guest cost the machine, from
// testinit's ready line to its end line (all four turns and their set-up):
// the wall time, the machine's busy CPU time meanwhile and, on our VMM,
// its exits.
type SDKBootWork struct {
	System      string  `json:"system"`
	Run         int     `json:"run"`
	WindowMS    float64 `json:"window_ms"`
	BusyMS      float64 `json:"busy_ms"`
	Runs        uint64  `json:"kvm_runs,omitempty"`
	IOExits     uint64  `json:"io_exits,omitempty"`
	MMIOExits   uint64  `json:"mmio_exits,omitempty"`
	Interrupted uint64  `json:"interrupted,omitempty"`
}

// sdkResults accumulates the runs.
type sdkResults struct {
	version  string
	runs     int
	skip     string
	samples  map[string]map[string][]time.Duration // system → metric → samples
	failures map[string][]string
	skipped  map[string]string
	work     []SDKBootWork
	// turnWork samples each turn's work in a guest (nil: not measured);
	// the figures go to the work accounting, per turn.
	turnWork *fsWork
	notes    []string
}

func newSDKResults(runs int) *sdkResults {
	return &sdkResults{runs: runs, samples: map[string]map[string][]time.Duration{}, failures: map[string][]string{}, skipped: map[string]string{}}
}

// add records one boot's (or native round's) turns on system.
func (r *sdkResults) add(system string, run int, results []fsbench.Result) {
	for _, res := range results {
		if res.Err != "" || res.Skip != "" {
			r.failures[system] = append(r.failures[system], fmt.Sprintf("run %d, %s: %s", run, res.Workload, res.Err+res.Skip))
			continue
		}
		for _, m := range sdkMetrics {
			if m.Turn != res.Workload {
				continue
			}
			if ns, ok := res.Values[m.Key]; ok && ns > 0 {
				if r.samples[system] == nil {
					r.samples[system] = map[string][]time.Duration{}
				}
				r.samples[system][m.ID] = append(r.samples[system][m.ID], time.Duration(ns))
			}
		}
	}
}

// sdkVersus are the systems ours is compared with, and the targets: the
// first byte of every turn in our guest at most 1.1× native's, and below
// qemu + virtiofsd's (issue #42).
var sdkVersus = []struct {
	system, phrase string
	max            float64
	below          bool
}{
	{SDKNative, "≤ 1.1× native", 1.1, false},
	{guestboot.FSQemuVirtiofsd, "below qemu + virtiofsd", 1, true},
}

// report summarises the runs.
func (r *sdkResults) report() *SDKReport {
	rep := &SDKReport{Version: r.version, Runs: r.runs, Skipped: r.skip, Work: r.work, Notes: r.notes}
	if r.skip != "" {
		return rep
	}
	for _, m := range sdkMetrics {
		rep.Metrics = append(rep.Metrics, FSMetricOverview{ID: m.ID, Label: m.Label})
	}
	for _, id := range sdkSystems {
		sr := SDKSystemReport{ID: id, Label: sdkSystemLabel(id), Failures: r.failures[id], Skipped: r.skipped[id]}
		for _, m := range sdkMetrics {
			if samples := r.samples[id][m.ID]; len(samples) > 0 {
				sr.Metrics = append(sr.Metrics, phaseReport(m.ID, m.Label, samples))
			}
		}
		rep.Systems = append(rep.Systems, sr)
	}
	ours := guestboot.FSOursVirtioFS
	for _, v := range sdkVersus {
		for _, m := range sdkMetrics {
			ratio := Ratio(rep.median(ours, m.ID), rep.median(v.system, m.ID))
			if !math.IsNaN(ratio) {
				rep.Ratios = append(rep.Ratios, RatioReport{Phase: m.ID, System: ours, Peer: v.system, Ratio: roundRatio(ratio)})
			}
			if m.Key != sdkturn.KeyFirstByte {
				continue
			}
			t := BootTargetReport{Label: m.Label + ": our guest " + v.phrase, System: ours, Phase: m.ID,
				Versus: v.system, VersusPhase: m.ID, MaxRatio: v.max, Below: v.below}
			if !math.IsNaN(ratio) {
				t.Measured, t.Ratio = true, roundRatio(ratio)
				t.Met = ratio < t.MaxRatio || (!t.Below && ratio == t.MaxRatio)
			}
			rep.Targets = append(rep.Targets, t)
		}
	}
	return rep
}

// median is system's median of metric, 0 without one.
func (r *SDKReport) median(system, metric string) time.Duration {
	if p := r.metric(system, metric); p != nil {
		return fromMS(p.MedianMS)
	}
	return 0
}

func (r *SDKReport) metric(system, metric string) *PhaseReport {
	for _, s := range r.Systems {
		if s.ID == system {
			return findPhase(s.Metrics, metric)
		}
	}
	return nil
}

func (r *SDKReport) ratio(metric, versus string) (float64, bool) {
	for _, x := range r.Ratios {
		if x.Phase == metric && x.Peer == versus {
			return x.Ratio, true
		}
	}
	return 0, false
}

// writeSDKMarkdown writes the section: a row per metric, a column per
// system, then ours over each other system; the targets with their
// figures; failures, skips and notes.
func writeSDKMarkdown(b *strings.Builder, r *SDKReport) {
	if r == nil {
		return
	}
	if r.Skipped != "" {
		fmt.Fprintf(b, "### The real Claude Code CLI: not measured\n\n- %s\n\n", r.Skipped)
		return
	}
	fmt.Fprintf(b, "### The real Claude Code CLI %s: %d boot(s) per system\n\n", r.Version, r.Runs)
	b.WriteString("Each cell: median (min–max) from the spawn. ours / X: our guest's median over X's (below 1: ours is faster).\n\n")
	header := []string{"turn"}
	sep := []string{"---"}
	for _, s := range r.Systems {
		header, sep = append(header, s.Label), append(sep, "---:")
	}
	for _, v := range sdkVersus {
		header, sep = append(header, "ours / "+v.system), append(sep, "---:")
	}
	writeRow(b, header)
	writeRow(b, sep)
	for _, m := range sdkMetrics {
		row := []string{m.Label}
		any := false
		for _, s := range r.Systems {
			p := findPhase(s.Metrics, m.ID)
			if p == nil {
				row = append(row, "—")
				continue
			}
			any = true
			row = append(row, fmtSpread(p))
		}
		for _, v := range sdkVersus {
			row = append(row, fmtRatio(r.ratio(m.ID, v.system)))
		}
		if any {
			writeRow(b, row)
		}
	}
	b.WriteString("\n")
	for _, t := range r.Targets {
		fmt.Fprintf(b, "- target: %s: %s%s\n", t.Label, verdict(t.Measured, t.Met, t.Ratio), r.figures(t))
	}
	for _, s := range r.Systems {
		if s.Skipped != "" {
			fmt.Fprintf(b, "- %s not measured: %s\n", s.Label, s.Skipped)
		}
		for _, f := range s.Failures {
			fmt.Fprintf(b, "- %s failed: %s\n", s.Label, f)
		}
	}
	writeSDKWork(b, r.Work)
	for _, n := range r.Notes {
		fmt.Fprintf(b, "- %s\n", n)
	}
	b.WriteString("\n")
}

// writeSDKWork writes a line per guest system: the medians, over its
// boots, of what the four turns and their set-up cost this machine (the
// wall time, the busy CPU time, our VMM's KVM runs and exits).
func writeSDKWork(b *strings.Builder, work []SDKBootWork) {
	for _, system := range sdkSystems {
		var window, busy []time.Duration
		var runs, io, mmio []int64
		for _, w := range work {
			if w.System == system {
				window, busy = append(window, fromMS(w.WindowMS)), append(busy, fromMS(w.BusyMS))
				runs, io, mmio = append(runs, int64(w.Runs)), append(io, int64(w.IOExits)), append(mmio, int64(w.MMIOExits))
			}
		}
		if len(window) == 0 {
			continue
		}
		fmt.Fprintf(b, "- %s, a boot's turns and their set-up (median of %d): %s wall, this machine busy %s",
			sdkSystemLabel(system), len(window), fmtMS(ms(Summarize(window).Median)), fmtMS(ms(Summarize(busy).Median)))
		if _, r, _ := summarizeInt64(runs); r > 0 {
			_, i, _ := summarizeInt64(io)
			_, m, _ := summarizeInt64(mmio)
			fmt.Fprintf(b, ", %d KVM runs, %d port I/O and %d MMIO exits", r, i, m)
		}
		b.WriteString("\n")
	}
}

// figures are a target's two medians, for its line.
func (r *SDKReport) figures(t BootTargetReport) string {
	var parts []string
	for _, id := range []string{t.System, t.Versus} {
		if p := r.metric(id, t.Phase); p != nil {
			parts = append(parts, sdkSystemLabel(id)+" "+fmtMS(p.MedianMS))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// FindSDK is the pinned CLI in dir (holding VERSION/claude), or in
// sdkcache's default directory when dir is empty.
func FindSDK(dir string) (sdkcache.SDK, error) {
	if dir == "" {
		return sdkcache.Find()
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return sdkcache.SDK{}, err
	}
	s := sdkcache.SDK{Dir: abs, Version: sdkcache.Version()}
	info, err := os.Stat(s.Binary())
	switch {
	case err != nil:
		return sdkcache.SDK{}, fmt.Errorf("--sdk-dir %s: the Claude Code CLI %s is not there (scripts/fetch-sdk.sh fetches it): %w", dir, s.Version, err)
	case !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0:
		return sdkcache.SDK{}, fmt.Errorf("--sdk-dir %s: %s is not an executable file", dir, s.Binary())
	}
	return s, nil
}

// stageSDK puts the CLI in dir at VERSION/claude (a hard link, else a
// copy) and returns that path relative to dir: every system runs this one
// file, from one directory on this machine's own file system (nested, the
// original lies on the outer guest's 9p share of the host).
func stageSDK(dir string, sdk sdkcache.SDK) (string, error) {
	rel := filepath.Join(sdk.Version, "claude")
	dst := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	if err := os.Link(sdk.Binary(), dst); err == nil {
		return rel, nil
	}
	src, err := os.Open(sdk.Binary())
	if err != nil {
		return "", err
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(out, src)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("copying the CLI into the shared directory: %w", err)
	}
	return rel, nil
}

// testGuestInitrd is the test guest's initramfs: --fs-initrd, the one
// measureFS built, or one built now.
func (b *benchRun) testGuestInitrd(ctx context.Context) (string, error) {
	if b.opts.FSInitrd != "" {
		return b.opts.FSInitrd, nil
	}
	initrd := filepath.Join(b.work, "fs-initrd.cpio.gz")
	if isFile(initrd) {
		return initrd, nil
	}
	b.show.status("SDK: building the test guest's initramfs")
	if err := guestboot.BuildInitramfs(ctx, initrd); err != nil {
		return "", fmt.Errorf("give --fs-initrd (the test guest's initramfs, built from the source tree): %s", firstLine(err.Error()))
	}
	return initrd, nil
}

// measureSDK runs the CLI's turns: SDKRuns boots of the test guest on
// each guest system and as many rounds natively, interleaved. Without the
// CLI, or without our VMM (the kvm backend), the section says why it was
// not measured.
func (b *benchRun) measureSDK(ctx context.Context) error {
	if b.opts.SDKRuns <= 0 || !b.selected(BenchSDK) {
		return nil
	}
	b.sdk = newSDKResults(b.opts.SDKRuns)
	sdk, err := FindSDK(b.opts.SDKDir)
	if err != nil {
		b.sdk.skip = firstLine(err.Error())
		return nil
	}
	b.sdk.version = sdk.Version
	if b.backend != "kvm" {
		b.sdk.skip = "it boots the test guest on our VMM, which the " + b.backend + " backend does not use"
		return nil
	}
	initrd, err := b.testGuestInitrd(ctx)
	if err != nil {
		b.sdk.skip = err.Error()
		return nil
	}
	dir := filepath.Join(b.work, "sdk-share")
	b.show.status("SDK: putting the CLI in the shared directory")
	rel, err := stageSDK(dir, sdk)
	if err != nil {
		return fmt.Errorf("SDK bench: %w", err)
	}
	fb := &fsrun.FSBench{Kernel: b.vmlinux, Initrd: initrd, Dir: dir, DataImmutable: true, Root: "/", MemMiB: b.opts.SDKMemMiB,
		Qemu: b.qemu, NoQemu: b.qemu == "", RunTimeout: sdkBootTimeout}
	b.sdk.notes = sdkNotes(b.opts.SDKMemMiB)
	if b.meter != nil {
		b.sdk.turnWork = newFSWork(*b.meter)
		fb.OnMark = b.sdk.turnWork.onMark
	}
	for _, s := range sdkSystems {
		if s != SDKNative {
			if why := fb.Unavailable(s); why != "" {
				b.sdk.skipped[s] = why
			}
		}
	}
	for run := 1; run <= b.opts.SDKRuns; run++ {
		for _, system := range sdkSystems {
			if b.sdk.skipped[system] != "" {
				continue
			}
			if err := b.sdkRun(ctx, fb, system, filepath.Join(dir, rel), rel, run); err != nil {
				return err
			}
		}
	}
	return nil
}

// sdkRun runs one boot's (natively, one round's) turns on system and
// records them; only the end of ctx is an error.
func (b *benchRun) sdkRun(ctx context.Context, fb *fsrun.FSBench, system, binary, rel string, run int) error {
	b.show.status("run %d/%d SDK turns, %s", run, b.opts.SDKRuns, system)
	start := time.Now()
	var results []fsbench.Result
	var err error
	if system == SDKNative {
		results, err = b.sdkNative(ctx, binary, run)
	} else {
		results, err = b.sdkGuest(ctx, fb, system, rel, run)
	}
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil && fsrun.IsUnavailable(err):
		b.sdk.skipped[system] = firstLine(err.Error())
		return nil
	case err != nil:
		b.sdk.failures[system] = append(b.sdk.failures[system], fmt.Sprintf("run %d: %s", run, firstLine(err.Error())))
		b.show.line("run %d SDK turns %s failed: %v", run, system, err)
	}
	b.sdk.add(system, run, results)
	b.show.line("run %d SDK turns %s: %v", run, system, time.Since(start).Round(time.Second))
	return nil
}

// sdkGuest boots the test guest once on system to run the turns.
func (b *benchRun) sdkGuest(ctx context.Context, fb *fsrun.FSBench, system, rel string, run int) ([]fsbench.Result, error) {
	data, root := fb.Mounts(system)
	cfg := sdkturn.Config{Binary: rel, Data: data, Root: root}
	mr, err := fb.Boot(ctx, system, cfg.Cmdline(), sdkturn.EndMarker)
	if mr.Window > 0 {
		b.sdk.work = append(b.sdk.work, SDKBootWork{System: system, Run: run, WindowMS: ms(mr.Window), BusyMS: ms(mr.Busy),
			Runs: mr.Exits.Runs, IOExits: mr.Exits.IOExits, MMIOExits: mr.Exits.MMIOExits, Interrupted: mr.Exits.Interrupted})
	}
	if b.sdk.turnWork != nil {
		for op, w := range b.sdk.turnWork.take() {
			b.accounts.Add(system, guestboot.FSSystemLabel(system), op, 1, w)
		}
	}
	results, perr := sdkturn.Results(mr.Console)
	switch {
	case perr == nil:
		return results, err // the guest's results stand even if its end was not clean
	case fsrun.IsUnavailable(err):
		return nil, err
	case err == nil:
		err = perr
	}
	return nil, fmt.Errorf("%w; console:\n%s", err, guestboot.TailLines(mr.Console, 30))
}

// sdkNative runs the turns here, against a fake API on this machine's
// loopback, with HOMEs in the work directory.
func (b *benchRun) sdkNative(ctx context.Context, binary string, run int) ([]fsbench.Result, error) {
	url, stop, err := sdkturn.Serve()
	if err != nil {
		return nil, err
	}
	defer stop()
	home := filepath.Join(b.work, fmt.Sprintf("sdk-native-%d", run))
	defer os.RemoveAll(home)
	var out []fsbench.Result
	sdkturn.Boot{Binary: binary, HomeDir: home, APIURL: url}.Run(ctx, func(r fsbench.Result) { out = append(out, r) })
	return out, nil
}

// sdkNotes say how the section was measured.
func sdkNotes(memMiB int) []string {
	return []string{
		"every system runs one copy of the CLI, in one directory of this machine: our VMM shares it read-only over its cached virtio-fs device, as the helper shares the installed SDK and the host's root cached (the CLI's C library; the CLI runs chrooted in it), qemu's virtiofsd with cache=auto and cache=always; natively the CLI runs from that directory",
		"the fake Messages API runs on each system's own loopback (in a guest, served by its init): the turns time starting and running the CLI, its binary read through the file share, not the egress path",
		"cold: the guest's page cache dropped and a fresh HOME; warm: the next run, same HOME. Natively, cold is only a fresh HOME: the CLI's file stays in this machine's page cache, as it does for the file servers",
		fmt.Sprintf("test guest: 1 vCPU, %d MiB", memMiB),
	}
}
