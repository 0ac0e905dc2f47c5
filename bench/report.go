package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// System ids of the report.
const (
	SystemOurs      = "cowork-vmm"
	SystemOursWarm  = "cowork-vmm-warm"
	SystemQemuMicro = "qemu-microvm"
	SystemQemuQ35   = "qemu-q35"
	// SystemQemuQ35OVMF is q35 with OVMF, the official helper's firmware.
	SystemQemuQ35OVMF = "qemu-q35-ovmf"
	reportVersion     = 1
	kibPerMiB         = 1024
)

// Results accumulates the samples of a bench run, system by system, in the
// order systems were added.
type Results struct {
	order   []string
	systems map[string]*systemResults
}

type systemResults struct {
	label    string
	peer     bool
	samples  map[string][]time.Duration
	memory   []Memory
	failures []string
	// stepOrder and steps: the guest set-up's steps, in the order they
	// were first seen, and each one's samples.
	stepOrder []string
	steps     map[string][]time.Duration
}

// NewResults returns empty results.
func NewResults() *Results { return &Results{systems: make(map[string]*systemResults)} }

// AddSystem declares a system (idempotent); peer systems are the ones ours
// is compared against.
func (r *Results) AddSystem(id, label string, peer bool) {
	if _, ok := r.systems[id]; ok {
		return
	}
	r.order = append(r.order, id)
	r.systems[id] = &systemResults{label: label, peer: peer, samples: make(map[string][]time.Duration)}
}

// AddRun records one run's phase durations (and memory, if sampled).
func (r *Results) AddRun(id string, phases map[string]time.Duration, mem *Memory) {
	s := r.systems[id]
	if s == nil {
		return
	}
	for p, d := range phases {
		s.samples[p] = append(s.samples[p], d)
	}
	if mem != nil {
		s.memory = append(s.memory, *mem)
	}
}

// AddSetupSteps records one run's guest set-up steps.
func (r *Results) AddSetupSteps(id string, steps []SetupStep) {
	s := r.systems[id]
	if s == nil {
		return
	}
	if s.steps == nil {
		s.steps = make(map[string][]time.Duration)
	}
	for _, st := range steps {
		if _, seen := s.steps[st.Name]; !seen {
			s.stepOrder = append(s.stepOrder, st.Name)
		}
		s.steps[st.Name] = append(s.steps[st.Name], st.Duration)
	}
}

// AddFailure records why one run of a system failed.
func (r *Results) AddFailure(id, msg string) {
	if s := r.systems[id]; s != nil {
		s.failures = append(s.failures, msg)
	}
}

// Report is what `bench` writes as report.json.
type Report struct {
	Version     int            `json:"version"`
	Date        time.Time      `json:"date"`
	Host        Host           `json:"host"`
	Runs        int            `json:"runs"`
	Backend     string         `json:"backend"`
	BinaryBytes int64          `json:"binary_bytes"`
	Systems     []SystemReport `json:"systems"`
	Ratios      []RatioReport  `json:"ratios,omitempty"`
	// BootTargets are issue #17's targets (targets.go), on the kvm backend.
	BootTargets []BootTargetReport `json:"boot_targets,omitempty"`
	Notes       []string           `json:"notes,omitempty"`
	// FS is the file-sharing benchmark (fs.go) and Blk the block-device
	// one, when they ran.
	FS  *FSReport `json:"fs,omitempty"`
	Blk *FSReport `json:"blk,omitempty"`
	// SDK is the real Claude Code CLI's turns (sdk.go), when they ran.
	SDK *SDKReport `json:"sdk,omitempty"`
	// Work is the work accounting (workreport.go): KVM exits by reason and
	// the VMMs' CPU time per operation, when measured.
	Work *WorkReport `json:"work,omitempty"`
}

// ioSections are the report's file-sharing and block-device sections
// that ran.
func (rep Report) ioSections() []*FSReport {
	var out []*FSReport
	for _, s := range []*FSReport{rep.FS, rep.Blk} {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

// Host describes where the figures were measured.
type Host struct {
	Kernel string `json:"kernel"`
	CPUs   int    `json:"cpus"`
	KVM    string `json:"kvm"` // "real", "none", "pvm" …
	Nested bool   `json:"nested"`
	Go     string `json:"go"`
	// Clocksource is the kernel's clocksource the times were measured
	// with; a tick-based one (jiffies) makes every time a multiple of the
	// tick, and the report says so at its top.
	Clocksource string `json:"clocksource,omitempty"`
}

// SystemReport is one system's phases and memory.
type SystemReport struct {
	ID       string        `json:"id"`
	Label    string        `json:"label"`
	Peer     bool          `json:"peer"`
	Phases   []PhaseReport `json:"phases"`
	Memory   *MemoryReport `json:"memory,omitempty"`
	Failures []string      `json:"failures,omitempty"`
	// SetupSteps are the guest set-up's steps (ours only), each with its
	// samples: a step some runs lack (the root disk's format) has fewer.
	SetupSteps []PhaseReport `json:"setup_steps,omitempty"`
}

// PhaseReport is one phase's samples and their spread, in milliseconds.
type PhaseReport struct {
	ID        string    `json:"id"`
	Label     string    `json:"label"`
	SamplesMS []float64 `json:"samples_ms"`
	MinMS     float64   `json:"min_ms"`
	MedianMS  float64   `json:"median_ms"`
	MaxMS     float64   `json:"max_ms"`
}

// MemoryReport is the spread of the memory samples, in KiB.
type MemoryReport struct {
	RSS       KiBStats `json:"rss_kib"`
	HWM       KiBStats `json:"hwm_kib"`
	VMM       KiBStats `json:"vmm_kib"`
	Guest     KiBStats `json:"guest_kib"`
	Separated bool     `json:"separated"`
}

// KiBStats is min/median/max of a KiB figure.
type KiBStats struct {
	Min    int64 `json:"min"`
	Median int64 `json:"median"`
	Max    int64 `json:"max"`
}

// RatioReport is ours' median over a peer's for one phase (below 1: we
// are faster).
type RatioReport struct {
	Phase  string  `json:"phase"`
	System string  `json:"system"`
	Peer   string  `json:"peer"`
	Ratio  float64 `json:"ratio"`
}

// Report summarises the results.
func (r *Results) Report(meta Report) Report {
	rep := meta
	rep.Version = reportVersion
	rep.Systems = nil
	rep.Ratios = nil
	for _, id := range r.order {
		s := r.systems[id]
		sr := SystemReport{ID: id, Label: s.label, Peer: s.peer, Failures: s.failures}
		for _, p := range Phases {
			if samples := s.samples[p.ID]; len(samples) > 0 {
				sr.Phases = append(sr.Phases, phaseReport(p.ID, p.Label, samples))
			}
		}
		for _, name := range s.stepOrder {
			sr.SetupSteps = append(sr.SetupSteps, phaseReport(name, name, s.steps[name]))
		}
		if len(s.memory) > 0 {
			sr.Memory = memoryReport(s.memory)
		}
		rep.Systems = append(rep.Systems, sr)
	}
	var first string // our first system (cold): our others are compared to it too
	for _, ours := range rep.Systems {
		if ours.Peer {
			continue
		}
		if first == "" {
			first = ours.ID
		}
		for _, peer := range rep.Systems {
			if !peer.Peer && (peer.ID != first || ours.ID == first) {
				continue
			}
			for _, p := range Phases {
				a, b := ours.phase(p.ID), peer.phase(p.ID)
				if a == nil || b == nil {
					continue
				}
				ratio := Ratio(fromMS(a.MedianMS), fromMS(b.MedianMS))
				if !math.IsNaN(ratio) {
					rep.Ratios = append(rep.Ratios, RatioReport{Phase: p.ID, System: ours.ID, Peer: peer.ID, Ratio: roundRatio(ratio)})
				}
			}
		}
	}
	rep.BootTargets = bootTargetReports(rep.Backend, rep.Systems)
	return rep
}

// phaseReport summarises one phase's (or set-up step's) samples.
func phaseReport(id, label string, samples []time.Duration) PhaseReport {
	sum := Summarize(samples)
	pr := PhaseReport{ID: id, Label: label, MinMS: ms(sum.Min), MedianMS: ms(sum.Median), MaxMS: ms(sum.Max)}
	for _, d := range samples {
		pr.SamplesMS = append(pr.SamplesMS, ms(d))
	}
	return pr
}

func (s SystemReport) phase(id string) *PhaseReport { return findPhase(s.Phases, id) }

// findPhase returns the phase (or set-up step) id of ps, or nil.
func findPhase(ps []PhaseReport, id string) *PhaseReport {
	for i := range ps {
		if ps[i].ID == id {
			return &ps[i]
		}
	}
	return nil
}

func memoryReport(samples []Memory) *MemoryReport {
	pick := func(f func(Memory) int64) KiBStats {
		var v []int64
		for _, m := range samples {
			v = append(v, f(m))
		}
		lo, med, hi := summarizeInt64(v)
		return KiBStats{Min: lo, Median: med, Max: hi}
	}
	separated := true
	for _, m := range samples {
		separated = separated && m.Separated
	}
	return &MemoryReport{
		RSS:       pick(func(m Memory) int64 { return m.RSSKiB }),
		HWM:       pick(func(m Memory) int64 { return m.HWMKiB }),
		VMM:       pick(func(m Memory) int64 { return m.VMMKiB }),
		Guest:     pick(func(m Memory) int64 { return m.GuestKiB }),
		Separated: separated,
	}
}

// ms converts to milliseconds with microsecond precision.
func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())) / 1000 }

func fromMS(v float64) time.Duration { return time.Duration(v * 1e6) }

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, rep Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("writing the JSON report: %w", err)
	}
	return nil
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(path string) (Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Report{}, err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return Report{}, fmt.Errorf("%s: %w", path, err)
	}
	return rep, nil
}

// WriteMarkdown writes the report as Markdown tables: one row per phase,
// a column per system (median, then min–max), a ratio column per peer;
// then memory and binary size; then the notes.
func WriteMarkdown(w io.Writer, rep Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## cowork-bench: %d run(s) per system, backend %s\n\n", rep.Runs, rep.Backend)
	if job.CoarseClocksource(rep.Host.Clocksource) {
		fmt.Fprintf(&b, "**Warning: measured on a coarse clock (clocksource %s): every time is a multiple of the timer tick (4 ms at HZ=250); differences below a few ticks mean nothing.**\n\n", rep.Host.Clocksource)
	}
	fmt.Fprintf(&b, "Host: %s, %d CPUs, KVM %s%s, clocksource %s. Times are median (min–max).\n\n", rep.Host.Kernel, rep.Host.CPUs, rep.Host.KVM, map[bool]string{true: " (nested)", false: ""}[rep.Host.Nested], cmp.Or(rep.Host.Clocksource, "unknown"))
	if len(rep.Systems) > 0 { // none when --benches left the boot bench out
		writePhases(&b, rep)
		b.WriteString("\n")
	}
	writeBootTargets(&b, rep.BootTargets)
	writeSetupSteps(&b, rep)
	writeMemory(&b, rep)
	if rep.BinaryBytes > 0 {
		fmt.Fprintf(&b, "Binary: %.1f MiB (%d bytes).\n\n", float64(rep.BinaryBytes)/(1<<20), rep.BinaryBytes)
	}
	for _, s := range rep.ioSections() {
		writeFSMarkdown(&b, s)
	}
	writeSDKMarkdown(&b, rep.SDK)
	writeWorkMarkdown(&b, rep.Work)
	for _, s := range rep.Systems {
		for _, f := range s.Failures {
			fmt.Fprintf(&b, "- %s failed a run: %s\n", s.Label, f)
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writePhases writes the phases' table: a row per phase some system
// measured, a column per system, then the ratio of each of ours to each
// peer and of our other systems (the warm start) to our first (cold).
func writePhases(b *strings.Builder, rep Report) {
	var ours []SystemReport
	var peers []SystemReport
	for _, s := range rep.Systems {
		if s.Peer {
			peers = append(peers, s)
		} else {
			ours = append(ours, s)
		}
	}
	header := []string{"phase"}
	for _, s := range rep.Systems {
		header = append(header, s.Label)
	}
	for _, o := range ours {
		for _, p := range peers {
			header = append(header, o.ID+" / "+p.ID)
		}
	}
	for _, o := range ours[min(1, len(ours)):] {
		header = append(header, o.ID+" / "+ours[0].ID)
	}
	writeRow(b, header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
		if i > 0 {
			sep[i] = "---:"
		}
	}
	writeRow(b, sep)
	for _, p := range Phases {
		row := []string{p.Label}
		any := false
		for _, s := range rep.Systems {
			pr := s.phase(p.ID)
			if pr == nil {
				row = append(row, "—")
				continue
			}
			any = true
			row = append(row, fmtSpread(pr))
		}
		for _, o := range ours {
			for _, peer := range peers {
				row = append(row, fmtRatio(rep.ratio(p.ID, o.ID, peer.ID)))
			}
		}
		for _, o := range ours[min(1, len(ours)):] {
			row = append(row, fmtRatio(rep.ratio(p.ID, o.ID, ours[0].ID)))
		}
		if any {
			writeRow(b, row)
		}
	}
}

// writeMemory writes the memory table, a row per system with figures:
// RSS, the VMM's share and the guest RAM touched when they could be told
// apart, and the peak.
func writeMemory(b *strings.Builder, rep Report) {
	var memRows [][]string
	for _, s := range rep.Systems {
		if s.Memory == nil {
			continue
		}
		m := s.Memory
		guest := "not separated"
		vmm := "—"
		if m.Separated {
			guest = fmtKiB(m.Guest)
			vmm = fmtKiB(m.VMM)
			if m.Guest.Max == 0 {
				guest = "none (no guest RAM in the process)"
			}
		}
		memRows = append(memRows, []string{s.Label, fmtKiB(m.RSS), vmm, guest, fmtKiB(m.HWM)})
	}
	if len(memRows) == 0 {
		return
	}
	writeRow(b, []string{"memory (median, min–max)", "RSS", "VMM without guest RAM", "guest RAM touched", "peak RSS (HWM)"})
	writeRow(b, []string{"---", "---:", "---:", "---:", "---:"})
	for _, r := range memRows {
		writeRow(b, r)
	}
	b.WriteString("\n")
}

// writeSetupSteps writes the guest set-up's steps as a table: a row per
// step (in the order the first system logged them), a column per system
// that has them (median, min–max, and how many runs had the step when
// not all did).
func writeSetupSteps(b *strings.Builder, rep Report) {
	var systems []SystemReport
	var order []string
	seen := map[string]bool{}
	for _, s := range rep.Systems {
		if len(s.SetupSteps) == 0 {
			continue
		}
		systems = append(systems, s)
		for _, st := range s.SetupSteps {
			if !seen[st.ID] {
				seen[st.ID] = true
				order = append(order, st.ID)
			}
		}
	}
	if len(systems) == 0 {
		return
	}
	header := []string{"guest set-up step (helper log)"}
	sep := []string{"---"}
	for _, s := range systems {
		header = append(header, s.Label)
		sep = append(sep, "---:")
	}
	writeRow(b, header)
	writeRow(b, sep)
	for _, name := range order {
		row := []string{name}
		for _, s := range systems {
			row = append(row, fmtStep(s, name, rep.Runs))
		}
		writeRow(b, row)
	}
	b.WriteString("\n")
}

// fmtStep is one cell of the set-up step table.
func fmtStep(s SystemReport, name string, runs int) string {
	st := findPhase(s.SetupSteps, name)
	if st == nil {
		return "—"
	}
	cell := fmtSpread(st)
	if n := len(st.SamplesMS); n != runs {
		cell += fmt.Sprintf(", %d of %d runs", n, runs)
	}
	return cell
}

// fmtSpread is a phase's median, then min–max.
func fmtSpread(pr *PhaseReport) string {
	return fmt.Sprintf("%s (%s–%s)", fmtMS(pr.MedianMS), fmtMS(pr.MinMS), fmtMS(pr.MaxMS))
}

// verdict is how a report states a target: the figure and whether it was
// met, or that it was not measured.
func verdict(measured, met bool, figure float64) string {
	switch {
	case !measured:
		return "not measured"
	case met:
		return fmt.Sprintf("%.2f×, met", figure)
	default:
		return fmt.Sprintf("%.2f×, not met", figure)
	}
}

func (rep Report) ratio(phase, system, peer string) (float64, bool) {
	for _, r := range rep.Ratios {
		if r.Phase == phase && r.System == system && r.Peer == peer {
			return r.Ratio, true
		}
	}
	return 0, false
}

func writeRow(b *strings.Builder, cells []string) {
	b.WriteString("| ")
	for i, c := range cells {
		if i > 0 {
			b.WriteString(" | ")
		}
		b.WriteString(strings.ReplaceAll(c, "|", "\\|"))
	}
	b.WriteString(" |\n")
}

func fmtMS(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

func fmtRatio(v float64, ok bool) string {
	if !ok {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v)
}

func fmtKiB(s KiBStats) string {
	f := func(k int64) string { return fmt.Sprintf("%.1f", float64(k)/kibPerMiB) }
	return fmt.Sprintf("%s MiB (%s–%s)", f(s.Median), f(s.Min), f(s.Max))
}

// label is system's label, or its id when it was never added.
func (r *Results) label(id string) string {
	if s := r.systems[id]; s != nil {
		return s.label
	}
	return id
}
