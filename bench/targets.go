package bench

import (
	"cmp"
	"fmt"
	"math"
	"strings"
	"time"
)

// BootTargetReport is one of issue #17's boot-latency targets: the median
// of System's Phase over the median of Versus's VersusPhase, which must be
// at most MaxRatio (below it when Below).
type BootTargetReport struct {
	Label       string  `json:"label"`
	System      string  `json:"system"`
	Phase       string  `json:"phase"`
	Versus      string  `json:"versus"`
	VersusPhase string  `json:"versus_phase"`
	MaxRatio    float64 `json:"max_ratio"`
	Below       bool    `json:"below,omitempty"`
	Ratio       float64 `json:"ratio,omitempty"`
	Met         bool    `json:"met"`
	// Measured is false when either side has no figure (a system that did
	// not run here, or whose runs all failed).
	Measured bool `json:"measured"`
}

// bootTargets are issue #17's targets: a start restored from the snapshot
// within a tenth of a cold one, and a cold start's agent connected before
// qemu's q35 (under either firmware) reaches /init.
var bootTargets = []BootTargetReport{
	{Label: "restored startVM → agent connected ≤ 0.1× a cold one", System: SystemOursWarm, Phase: "start_to_connected",
		Versus: SystemOurs, VersusPhase: "start_to_connected", MaxRatio: 0.1},
	{Label: "cold startVM → agent connected below qemu q35 + SeaBIOS's start → /init", System: SystemOurs, Phase: "start_to_connected",
		Versus: SystemQemuQ35, VersusPhase: "start_to_init", MaxRatio: 1, Below: true},
	{Label: "cold startVM → agent connected below qemu q35 + OVMF's start → /init", System: SystemOurs, Phase: "start_to_connected",
		Versus: SystemQemuQ35OVMF, VersusPhase: "start_to_init", MaxRatio: 1, Below: true},
}

// bootTargetReports judges bootTargets against the systems' medians; a
// report of the process backend (no VM) has none.
func bootTargetReports(backend string, systems []SystemReport) []BootTargetReport {
	if backend != "kvm" {
		return nil
	}
	median := func(system, phase string) time.Duration {
		for _, s := range systems {
			if s.ID != system {
				continue
			}
			if p := s.phase(phase); p != nil {
				return fromMS(p.MedianMS)
			}
		}
		return 0
	}
	out := make([]BootTargetReport, 0, len(bootTargets))
	for _, t := range bootTargets {
		if ratio := Ratio(median(t.System, t.Phase), median(t.Versus, t.VersusPhase)); !math.IsNaN(ratio) {
			t.Measured = true
			t.Ratio = roundRatio(ratio)
			t.Met = ratio < t.MaxRatio || (!t.Below && ratio == t.MaxRatio)
		}
		out = append(out, t)
	}
	return out
}

// writeBootTargets writes one line per target: its ratio and whether it
// was met.
func writeBootTargets(b *strings.Builder, targets []BootTargetReport) {
	for _, t := range targets {
		fmt.Fprintf(b, "- target: %s: %s\n", t.Label, verdict(t.Measured, t.Met, t.Ratio))
	}
	if len(targets) > 0 {
		b.WriteString("\n")
	}
}

// WorkTargetReport is one of issue #42's work targets: System's Figure
// per Op (IOExitsKey's exits, or "cpu_ms", the VMM's CPU time) over
// Versus's, which must be at most MaxRatio.
type WorkTargetReport struct {
	Label    string  `json:"label"`
	Op       string  `json:"op"`
	Figure   string  `json:"figure"`
	System   string  `json:"system"`
	Versus   string  `json:"versus"`
	MaxRatio float64 `json:"max_ratio"`
	Ours     float64 `json:"ours,omitempty"`
	Theirs   float64 `json:"theirs,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	Met      bool    `json:"met"`
	// Measured is false when either side has no figure; Why says which.
	Measured bool   `json:"measured"`
	Why      string `json:"why,omitempty"`
}

// Figures of WorkTargetReport for the VMM's CPU time: all of it (user +
// system), and without the part its vCPUs ran the guest.
const (
	figureCPU    = "cpu_ms"
	figureVMMCPU = "vmm_cpu_ms"
)

// workTargets are issue #42's targets on the work per operation.
var workTargets = []WorkTargetReport{
	{Label: "I/O-driven exits (io+mmio) per MiB read ≤ 0.5× qemu + virtiofsd's", Op: "seq_read", Figure: IOExitsKey,
		System: "ours-virtiofs", Versus: "qemu-virtiofsd", MaxRatio: 0.5},
	{Label: "I/O-driven exits (io+mmio) per boot to /init ≤ 0.5× qemu microvm's", Op: WorkBoot, Figure: IOExitsKey,
		System: SystemOurs, Versus: SystemQemuMicro, MaxRatio: 0.5},
	{Label: "VMM CPU-ms per MiB read ≤ qemu + virtiofsd's (both processes)", Op: "seq_read", Figure: figureCPU,
		System: "ours-virtiofs", Versus: "qemu-virtiofsd", MaxRatio: 1},
	// The same without the time the vCPU threads ran the guest (which
	// both count as user time): the VMMs' own work.
	{Label: "VMM CPU-ms per MiB read, less the guest's own, ≤ qemu + virtiofsd's", Op: "seq_read", Figure: figureVMMCPU,
		System: "ours-virtiofs", Versus: "qemu-virtiofsd", MaxRatio: 1},
}

// workTargetReports judges workTargets against the systems' medians.
func workTargetReports(systems []WorkSystemReport) []WorkTargetReport {
	rep := &WorkReport{Systems: systems}
	figure := func(system, op, fig string) (float64, string) {
		s := rep.system(system)
		o := s.op(op)
		switch {
		case s == nil:
			return 0, system + " did not run"
		case o == nil:
			return 0, system + " has no " + op
		case (fig == figureCPU || fig == figureVMMCPU) && o.CPUNotMeasured != "":
			return 0, system + "'s CPU time " + notMeasured(o.CPUNotMeasured)
		case fig == figureCPU || fig == figureVMMCPU:
			v, _ := o.cpuOf(fig)
			return v, ""
		}
		if v, ok := o.exits(fig); ok {
			return v, ""
		}
		return 0, system + "'s exits " + notMeasured(o.ExitsNotMeasured)
	}
	out := make([]WorkTargetReport, 0, len(workTargets))
	for _, t := range workTargets {
		ours, why := figure(t.System, t.Op, t.Figure)
		theirs, whyTheirs := figure(t.Versus, t.Op, t.Figure)
		t.Why = cmp.Or(why, whyTheirs)
		if t.Why == "" && theirs > 0 {
			t.Measured, t.Ours, t.Theirs = true, ours, theirs
			t.Ratio = roundRatio(ours / theirs)
			t.Met = ours <= t.MaxRatio*theirs
		} else if t.Why == "" {
			t.Why = t.Versus + "'s figure is 0: no ratio"
		}
		out = append(out, t)
	}
	return out
}

// writeWorkTargets writes one line per work target: both figures, the
// ratio and whether it was met, or why it was not measured.
func writeWorkTargets(b *strings.Builder, targets []WorkTargetReport) {
	for _, t := range targets {
		if !t.Measured {
			fmt.Fprintf(b, "- target: %s: not measured (%s)\n", t.Label, t.Why)
			continue
		}
		unit := "exits"
		if t.Figure == figureCPU || t.Figure == figureVMMCPU {
			unit = "CPU-ms"
		}
		fmt.Fprintf(b, "- target: %s: %s %s %s vs %s %s per %s: %s\n", t.Label, t.System, fmtCount(t.Ours), unit,
			t.Versus, fmtCount(t.Theirs), workOp(t.Op).Unit, verdict(true, t.Met, t.Ratio))
	}
}
