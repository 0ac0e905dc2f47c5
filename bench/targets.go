package bench

import (
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
