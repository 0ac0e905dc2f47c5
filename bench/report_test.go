package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	assert.Equal(t, Summary{}, Summarize(nil))
	assert.Equal(t, Summary{N: 1, Min: 5 * ms, Median: 5 * ms, Max: 5 * ms}, Summarize([]time.Duration{5 * ms}))
	assert.Equal(t, Summary{N: 3, Min: 1 * ms, Median: 4 * ms, Max: 9 * ms}, Summarize([]time.Duration{9 * ms, 1 * ms, 4 * ms}))
	// Even count: the mean of the two middle samples.
	assert.Equal(t, Summary{N: 4, Min: 1 * ms, Median: 5 * ms, Max: 20 * ms}, Summarize([]time.Duration{20 * ms, 6 * ms, 1 * ms, 4 * ms}))
	in := []time.Duration{3, 1, 2}
	Summarize(in)
	assert.Equal(t, []time.Duration{3, 1, 2}, in, "the caller's samples are not reordered")
}

func TestRatio(t *testing.T) {
	assert.InDelta(t, 0.5, Ratio(time.Second, 2*time.Second), 1e-12)
	assert.InDelta(t, 3, Ratio(3*time.Millisecond, time.Millisecond), 1e-12)
	assert.True(t, math.IsNaN(Ratio(0, time.Second)), "no ratio from a missing figure")
	assert.True(t, math.IsNaN(Ratio(time.Second, 0)))
}

func TestSummarizeInt64(t *testing.T) {
	lo, med, hi := summarizeInt64([]int64{10, 40, 20, 30})
	assert.Equal(t, []int64{10, 25, 40}, []int64{lo, med, hi})
}

// sampleResults is a bench of our VMM and two peers, 3 runs each.
func sampleResults() *Results {
	ms := time.Millisecond
	r := NewResults()
	r.AddSystem(SystemOurs, "cowork-vmm (kvm backend)", false)
	r.AddSystem(SystemQemuMicro, "qemu microvm", true)
	r.AddSystem(SystemQemuQ35, "qemu q35 + SeaBIOS", true)
	for i := range 3 {
		d := time.Duration(i) * ms
		r.AddRun(SystemOurs, map[string]time.Duration{
			"helper_start": 20*ms + d, "vm_create": 30*ms + d, "vcpu_start": 2*ms + d, "kernel_boot": 100*ms + d,
			"start_to_init": 132*ms + d, "start_reply": 35*ms + d, "agent_dial": 4*ms + d, "agent_setup": 6*ms + d, "agent_hello": 1*ms + d, "guest_setup": 4*ms + d, "connected_poll": 1*ms + d, "agent_connect": 10*ms + d, "start_to_connected": 142*ms + d,
			"spawn_exit": 3*ms + d, "echo_first_byte": 4*ms + d, "stop": 6*ms + d,
		}, &Memory{RSSKiB: 30000 + int64(i), HWMKiB: 31000, GuestKiB: 20000, VMMKiB: 10000 + int64(i), Separated: true})
		r.AddRun(SystemQemuMicro, map[string]time.Duration{"start_to_init": 264*ms + 2*d}, &Memory{RSSKiB: 60000, HWMKiB: 61000, GuestKiB: 20000, VMMKiB: 40000, Separated: true})
		r.AddRun(SystemQemuQ35, map[string]time.Duration{"start_to_init": 528*ms + 4*d}, nil)
	}
	for i := range 3 {
		d := time.Duration(i) * ms
		steps := []SetupStep{{"setup", 10*ms + d}, {"agent.hello", 2*ms + d}}
		if i == 0 {
			steps = append(steps, SetupStep{"agent.root_disk.format", 50 * ms})
		}
		r.AddSetupSteps(SystemOurs, steps)
	}
	r.AddFailure(SystemQemuQ35, "one boot timed out")
	return r
}

func sampleReport() Report {
	return sampleResults().Report(Report{
		Date: time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC), Runs: 3, Backend: "kvm", BinaryBytes: 10 << 20,
		Host:  Host{Kernel: "Linux 6.1", CPUs: 2, KVM: "real", Nested: true, Go: "go1.26"},
		Notes: []string{"q35 runs with SeaBIOS <not OVMF> & so on"},
	})
}

func TestReportSummaries(t *testing.T) {
	rep := sampleReport()
	require.Len(t, rep.Systems, 3)
	ours := rep.Systems[0]
	assert.False(t, ours.Peer)
	require.Len(t, ours.Phases, len(Phases))
	boot := ours.phase("kernel_boot")
	require.NotNil(t, boot)
	assert.Equal(t, []float64{100, 101, 102}, boot.SamplesMS)
	assert.Equal(t, 100.0, boot.MinMS)
	assert.Equal(t, 101.0, boot.MedianMS)
	assert.Equal(t, 102.0, boot.MaxMS)
	require.NotNil(t, ours.Memory)
	assert.Equal(t, KiBStats{Min: 10000, Median: 10001, Max: 10002}, ours.Memory.VMM)
	assert.True(t, ours.Memory.Separated)

	peer := rep.Systems[1]
	assert.True(t, peer.Peer)
	require.Len(t, peer.Phases, 1, "qemu measures only start → /init")
	assert.Equal(t, []string{"one boot timed out"}, rep.Systems[2].Failures)

	// Ratios only where both sides have the phase: ours/peer medians.
	require.Len(t, rep.Ratios, 2)
	assert.Equal(t, RatioReport{Phase: "start_to_init", System: SystemOurs, Peer: SystemQemuMicro, Ratio: 0.5}, rep.Ratios[0])
	assert.Equal(t, RatioReport{Phase: "start_to_init", System: SystemOurs, Peer: SystemQemuQ35, Ratio: 0.25}, rep.Ratios[1])
}

func TestJSONRoundTrip(t *testing.T) {
	rep := sampleReport()
	var b bytes.Buffer
	require.NoError(t, WriteJSON(&b, rep))
	var back Report
	require.NoError(t, json.Unmarshal(b.Bytes(), &back))
	assert.Equal(t, rep, back)
	assert.Contains(t, b.String(), `"median_ms": 101`)
}

// TestMarkdownWarnsOfACoarseClock: a report measured on jiffies says so
// at its top; one on a fine clock names it without the warning.
func TestMarkdownWarnsOfACoarseClock(t *testing.T) {
	rep := sampleReport()
	rep.Host.Clocksource = "refined-jiffies"
	var b bytes.Buffer
	require.NoError(t, WriteMarkdown(&b, rep))
	top := strings.SplitN(b.String(), "\n| ", 2)[0]
	assert.Contains(t, top, "Warning: measured on a coarse clock (clocksource refined-jiffies)")
	assert.Contains(t, top, "clocksource refined-jiffies.")

	rep.Host.Clocksource = "tsc"
	b.Reset()
	require.NoError(t, WriteMarkdown(&b, rep))
	assert.NotContains(t, b.String(), "coarse clock")
	assert.Contains(t, b.String(), "clocksource tsc.")
}

func TestMarkdownTable(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, WriteMarkdown(&b, sampleReport()))
	md := b.String()
	lines := strings.Split(md, "\n")
	header := ""
	rows := map[string]string{}
	for _, l := range lines {
		if !strings.HasPrefix(l, "| ") {
			continue
		}
		if header == "" {
			header = l
		}
		cells := strings.Split(l, " | ")
		rows[strings.TrimPrefix(cells[0], "| ")] = l
	}
	assert.Equal(t, "| phase | cowork-vmm (kvm backend) | qemu microvm | qemu q35 + SeaBIOS | cowork-vmm / qemu-microvm | cowork-vmm / qemu-q35 |", header)
	for _, p := range Phases {
		assert.Contains(t, rows, p.Label, "a row per phase")
	}
	assert.Equal(t, "| start → /init (total) | 133.0 ms (132.0 ms–134.0 ms) | 266.0 ms (264.0 ms–268.0 ms) | 532.0 ms (528.0 ms–536.0 ms) | 0.50× | 0.25× |", rows["start → /init (total)"])
	assert.Equal(t, "| kernel entry → /init (boot timer) | 101.0 ms (100.0 ms–102.0 ms) | — | — | — | — |", rows["kernel entry → /init (boot timer)"])
	assert.Equal(t, "| guest set-up step (helper log) | cowork-vmm (kvm backend) |", rows["guest set-up step (helper log)"])
	assert.Equal(t, "| setup | 11.0 ms (10.0 ms–12.0 ms) |", rows["setup"])
	assert.Equal(t, "| agent.hello | 3.00 ms (2.00 ms–4.00 ms) |", rows["agent.hello"])
	assert.Equal(t, "| agent.root_disk.format | 50.0 ms (50.0 ms–50.0 ms), 1 of 3 runs |", rows["agent.root_disk.format"])
	assert.Contains(t, rows, "cowork-vmm (kvm backend)", "memory row")
	assert.Contains(t, rows["cowork-vmm (kvm backend)"], "9.8 MiB (9.8–9.8)", "VMM without guest RAM")
	assert.Contains(t, md, "Binary: 10.0 MiB")
	assert.Contains(t, md, "- qemu q35 + SeaBIOS failed a run: one boot timed out")
	assert.Contains(t, md, "- q35 runs with SeaBIOS <not OVMF> & so on")
}

// svgBars parses the chart as XML and returns (phase, system) of each bar.
func svgBars(t *testing.T, r io.Reader) [][2]string {
	t.Helper()
	dec := xml.NewDecoder(r)
	var bars [][2]string
	sawRoot := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "the SVG is well-formed XML")
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if !sawRoot {
			require.Equal(t, "svg", se.Name.Local)
			sawRoot = true
		}
		attrs := map[string]string{}
		for _, a := range se.Attr {
			attrs[a.Name.Local] = a.Value
		}
		if se.Name.Local == "rect" && attrs["class"] == "bar" {
			bars = append(bars, [2]string{attrs["data-phase"], attrs["data-system"]})
		}
	}
	require.True(t, sawRoot)
	return bars
}

func TestSVGHasABarPerPhasePerSystem(t *testing.T) {
	rep := sampleReport()
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
	assert.Equal(t, want, bars)
	assert.Len(t, bars, len(Phases)+2, "every phase for ours, start → /init for each peer")
	svg := b.String()
	for _, s := range rep.Systems {
		assert.Contains(t, svg, ">"+s.Label+"</text>", "legend entry")
	}
	assert.Contains(t, svg, "log scale", "axis label")
	assert.Contains(t, svg, ">100ms</text>", "axis tick")
}

func TestSVGEscapesText(t *testing.T) {
	r := NewResults()
	r.AddSystem("a<b", "label & <tag>", false)
	r.AddRun("a<b", map[string]time.Duration{"stop": time.Millisecond}, nil)
	var b bytes.Buffer
	require.NoError(t, WriteSVG(&b, r.Report(Report{Host: Host{Kernel: "k&<"}})))
	assert.Len(t, svgBars(t, &b), 1)
}

func TestSVGWithoutData(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, WriteSVG(&b, NewResults().Report(Report{})))
	assert.Empty(t, svgBars(t, &b))
}

// A warm-start system is compared with the peers and with our cold start,
// and the table has a column for that.
func TestWarmStartIsComparedWithTheColdStart(t *testing.T) {
	r := NewResults()
	r.AddSystem(SystemOurs, "cold", false)
	r.AddSystem(SystemOursWarm, "warm", false)
	r.AddSystem(SystemQemuMicro, "qemu", true)
	for i := range 3 {
		r.AddRun(SystemOurs, map[string]time.Duration{"start_to_init": time.Duration(1000+i) * time.Millisecond}, nil)
		r.AddRun(SystemOursWarm, map[string]time.Duration{"start_to_init": time.Duration(100+i) * time.Millisecond}, nil)
		r.AddRun(SystemQemuMicro, map[string]time.Duration{"start_to_init": 2000 * time.Millisecond}, nil)
	}
	rep := r.Report(Report{Runs: 3, Backend: "kvm"})
	assert.Contains(t, rep.Ratios, RatioReport{Phase: "start_to_init", System: SystemOursWarm, Peer: SystemOurs, Ratio: 0.101})
	assert.Contains(t, rep.Ratios, RatioReport{Phase: "start_to_init", System: SystemOursWarm, Peer: SystemQemuMicro, Ratio: 0.051})
	assert.NotContains(t, rep.Ratios, RatioReport{Phase: "start_to_init", System: SystemOurs, Peer: SystemOursWarm, Ratio: 10})
	var md bytes.Buffer
	require.NoError(t, WriteMarkdown(&md, rep))
	assert.Contains(t, md.String(), SystemOursWarm+" / "+SystemOurs)
}
