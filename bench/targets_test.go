package bench

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// targetResults is a bench whose cold start connects in coldMS, its
// restored start in warmMS, and q35 + SeaBIOS reaches /init in q35MS; no
// q35 + OVMF ran.
func targetResults(coldMS, warmMS, q35MS int) *Results {
	r := NewResults()
	r.AddSystem(SystemOurs, "cold", false)
	r.AddSystem(SystemOursWarm, "warm", false)
	r.AddSystem(SystemQemuQ35, "qemu q35 + SeaBIOS", true)
	for i := range 3 {
		d := time.Duration(i) * time.Millisecond
		r.AddRun(SystemOurs, map[string]time.Duration{"start_to_connected": time.Duration(coldMS)*time.Millisecond + d}, nil)
		r.AddRun(SystemOursWarm, map[string]time.Duration{"start_to_connected": time.Duration(warmMS)*time.Millisecond + d}, nil)
		r.AddRun(SystemQemuQ35, map[string]time.Duration{"start_to_init": time.Duration(q35MS)*time.Millisecond + d}, nil)
	}
	return r
}

func TestBootTargetsNotMet(t *testing.T) {
	rep := targetResults(3901, 2601, 2871).Report(Report{Runs: 3, Backend: "kvm"})
	require.Len(t, rep.BootTargets, 3)
	restored, seabios, ovmf := rep.BootTargets[0], rep.BootTargets[1], rep.BootTargets[2]
	assert.True(t, restored.Measured)
	assert.InDelta(t, 0.667, restored.Ratio, 0.001)
	assert.False(t, restored.Met)
	assert.InDelta(t, 1.359, seabios.Ratio, 0.001)
	assert.False(t, seabios.Met)
	assert.False(t, ovmf.Measured, "no q35 + OVMF ran")

	var md bytes.Buffer
	require.NoError(t, WriteMarkdown(&md, rep))
	assert.Contains(t, md.String(), "- target: restored startVM → agent connected ≤ 0.1× a cold one: 0.67×, not met\n")
	assert.Contains(t, md.String(), "- target: cold startVM → agent connected below qemu q35 + SeaBIOS's start → /init: 1.36×, not met\n")
	assert.Contains(t, md.String(), "- target: cold startVM → agent connected below qemu q35 + OVMF's start → /init: not measured\n")

	b, err := json.Marshal(rep)
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, rep.BootTargets, back.BootTargets)
}

func TestBootTargetsMet(t *testing.T) {
	rep := targetResults(2000, 140, 2871).Report(Report{Runs: 3, Backend: "kvm"})
	assert.True(t, rep.BootTargets[0].Met)
	assert.True(t, rep.BootTargets[1].Met)
	var md bytes.Buffer
	require.NoError(t, WriteMarkdown(&md, rep))
	assert.Contains(t, md.String(), "- target: restored startVM → agent connected ≤ 0.1× a cold one: 0.07×, met\n")
}

// Equal medians are not "below" the peer, but are "at most" a bound.
func TestBootTargetsAtTheBound(t *testing.T) {
	rep := targetResults(2871, 288, 2871).Report(Report{Runs: 3, Backend: "kvm"})
	assert.False(t, rep.BootTargets[1].Met, "as slow as q35 is not below it")
	targets := bootTargetReports("kvm", []SystemReport{
		{ID: SystemOurs, Phases: []PhaseReport{{ID: "start_to_connected", MedianMS: 1000}}},
		{ID: SystemOursWarm, Phases: []PhaseReport{{ID: "start_to_connected", MedianMS: 100}}},
	})
	assert.True(t, targets[0].Met, "exactly a tenth is within the target")
}

func TestBootTargetsOnlyForTheKVMBackend(t *testing.T) {
	rep := targetResults(3901, 2601, 2871).Report(Report{Runs: 3, Backend: "process"})
	assert.Empty(t, rep.BootTargets)
	var md bytes.Buffer
	require.NoError(t, WriteMarkdown(&md, rep))
	assert.NotContains(t, md.String(), "- target:")
}
