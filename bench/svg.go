package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"text/template"
)

// Chart geometry, in SVG user units.
const (
	svgWidth      = 960
	svgLabelWidth = 300 // phase labels, left of the plot
	svgRight      = 90  // room for the value printed after a bar
	svgTop        = 70  // title and legend
	svgBarHeight  = 14
	svgBarGap     = 3
	svgGroupGap   = 14
	svgAxisHeight = 50
)

// Bar colours, one per system in report order (colour-blind safe).
var svgColours = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"}

type svgChart struct {
	Width, Height int
	Title         string
	Subtitle      string
	PlotLeft      int
	PlotRight     int
	AxisLabelX    int
	Panels        []svgPanel
}

type svgLegend struct {
	X, Y   int
	Colour string
	Label  string
}

type svgGroup struct {
	LabelY int
	Label  string
	Bars   []svgBar
}

type svgBar struct {
	Phase, System  string
	X, Y, W, H     float64
	Colour         string
	WhiskerX1      float64
	WhiskerX2      float64
	WhiskerY       float64
	ValueX, ValueY float64
	Value          string
}

type svgTick struct {
	X     float64
	Label string
}

var svgTemplate = template.Must(template.New("svg").Funcs(template.FuncMap{
	"add": func(a, b int) int { return a + b },
	"sub": func(a, b int) int { return a - b },
}).Parse(`<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" font-family="sans-serif" font-size="12">
<title>{{html .Title}}</title>
<rect x="0" y="0" width="{{.Width}}" height="{{.Height}}" fill="#ffffff"/>
<text x="10" y="20" font-size="16" font-weight="bold">{{html .Title}}</text>
<text x="10" y="38" fill="#444444">{{html .Subtitle}}</text>{{range .Panels}}{{$p := .}}
<g class="panel">{{if .Heading}}
<text x="10" y="{{.HeadingY}}" font-size="14" font-weight="bold">{{html .Heading}}</text>{{end}}
<g class="legend">{{range .Legend}}
<rect x="{{.X}}" y="{{.Y}}" width="12" height="12" fill="{{.Colour}}"/><text x="{{printf "%d" (add .X 16)}}" y="{{printf "%d" (add .Y 11)}}">{{html .Label}}</text>{{end}}
</g>
<g class="grid" stroke="#dddddd">{{range .Ticks}}
<line x1="{{printf "%.1f" .X}}" y1="{{$p.PlotTop}}" x2="{{printf "%.1f" .X}}" y2="{{$p.AxisY}}"/>{{end}}
</g>
<g class="groups">{{range .Groups}}
<text x="{{printf "%d" (sub $.PlotLeft 8)}}" y="{{.LabelY}}" text-anchor="end">{{html .Label}}</text>{{range .Bars}}
<rect class="bar" data-phase="{{html .Phase}}" data-system="{{html .System}}" x="{{printf "%.1f" .X}}" y="{{printf "%.1f" .Y}}" width="{{printf "%.1f" .W}}" height="{{printf "%.1f" .H}}" fill="{{.Colour}}"><title>{{html .System}}: {{html .Value}}</title></rect>
<line class="whisker" x1="{{printf "%.1f" .WhiskerX1}}" y1="{{printf "%.1f" .WhiskerY}}" x2="{{printf "%.1f" .WhiskerX2}}" y2="{{printf "%.1f" .WhiskerY}}" stroke="#222222" stroke-width="1"/>
<text x="{{printf "%.1f" .ValueX}}" y="{{printf "%.1f" .ValueY}}" font-size="10" fill="#222222">{{html .Value}}</text>{{end}}{{end}}
</g>
<g class="axis">
<line x1="{{$.PlotLeft}}" y1="{{.AxisY}}" x2="{{$.PlotRight}}" y2="{{.AxisY}}" stroke="#000000"/>{{range .Ticks}}
<line x1="{{printf "%.1f" .X}}" y1="{{$p.AxisY}}" x2="{{printf "%.1f" .X}}" y2="{{printf "%d" (add $p.AxisY 5)}}" stroke="#000000"/>
<text x="{{printf "%.1f" .X}}" y="{{printf "%d" (add $p.AxisY 18)}}" text-anchor="middle">{{html .Label}}</text>{{end}}
<text x="{{$.AxisLabelX}}" y="{{.AxisLabelY}}" text-anchor="middle">{{html .AxisLabel}}</text>
</g>
</g>{{end}}
</svg>
`))

// svgPanel is one chart of the SVG: a legend, a log time axis and a group
// of bars per row.
type svgPanel struct {
	Heading    string
	HeadingY   int
	PlotTop    int
	AxisY      int
	AxisLabelY int
	AxisLabel  string
	Legend     []svgLegend
	Groups     []svgGroup
	Ticks      []svgTick
}

// svgRow is one group of bars to draw: a label and a bar per system.
type svgRow struct {
	ID, Label string
	Bars      []svgValue
}

// svgValue is one bar: the system, its colour, min/median/max in ms and
// the text printed after it.
type svgValue struct {
	System, Colour   string
	Min, Median, Max float64
	Text             string
}

// addPanel draws rows below y (a heading first, when given) on a log
// time axis and returns the y below it.
func (c *svgChart) addPanel(y int, heading string, legend []svgLegend, rows []svgRow) int {
	return c.addPanelAxis(y, heading, legend, rows, "time, log scale (bar: median; line: min–max)", fmtTick)
}

// addPanelAxis is addPanel with the axis's label and its ticks' format.
func (c *svgChart) addPanelAxis(y int, heading string, legend []svgLegend, rows []svgRow, axis string, tick func(float64) string) int {
	p := svgPanel{Heading: heading, AxisLabel: axis}
	if heading != "" {
		p.HeadingY = y + 16
		y += 26
	}
	legendHeight := 0
	for _, l := range legend {
		legendHeight = max(legendHeight, l.Y)
		l.Y += y
		p.Legend = append(p.Legend, l)
	}
	y += 22 + legendHeight
	p.PlotTop = y
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		for _, v := range r.Bars {
			lo = math.Min(lo, v.Min)
			hi = math.Max(hi, v.Max)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	lo = math.Max(lo, 0.001)
	loDecade := math.Floor(math.Log10(lo))
	hiDecade := math.Ceil(math.Log10(math.Max(hi, lo*10)))
	if hiDecade <= loDecade {
		hiDecade = loDecade + 1
	}
	plotW := float64(c.PlotRight - c.PlotLeft)
	scale := func(v float64) float64 {
		v = math.Max(v, math.Pow(10, loDecade))
		return float64(c.PlotLeft) + (math.Log10(v)-loDecade)/(hiDecade-loDecade)*plotW
	}
	for d := loDecade; d <= hiDecade; d++ {
		p.Ticks = append(p.Ticks, svgTick{X: scale(math.Pow(10, d)), Label: tick(math.Pow(10, d))})
	}
	y += 10
	for _, r := range rows {
		if len(r.Bars) == 0 {
			continue
		}
		var bars []svgBar
		for _, v := range r.Bars {
			by := float64(y + len(bars)*(svgBarHeight+svgBarGap))
			end := scale(v.Median)
			bars = append(bars, svgBar{
				Phase: r.ID, System: v.System, Colour: v.Colour,
				X: float64(c.PlotLeft), Y: by, W: math.Max(end-float64(c.PlotLeft), 1), H: svgBarHeight,
				WhiskerX1: scale(v.Min), WhiskerX2: scale(v.Max), WhiskerY: by + svgBarHeight/2,
				ValueX: math.Max(end, scale(v.Max)) + 4, ValueY: by + svgBarHeight - 3,
				Value: v.Text,
			})
		}
		h := len(bars)*(svgBarHeight+svgBarGap) - svgBarGap
		p.Groups = append(p.Groups, svgGroup{Label: r.Label, LabelY: y + h/2 + 4, Bars: bars})
		y += h + svgGroupGap
	}
	p.AxisY = y
	p.AxisLabelY = y + 36
	c.Panels = append(c.Panels, p)
	return y + svgAxisHeight
}

// svgLegendLine is the height of a line of the legend.
const svgLegendLine = 18

// legendRow lays out a legend entry per label, left to right from y 0 of
// its panel, wrapping at the chart's width.
func legendRow(labels, colours []string) []svgLegend {
	var out []svgLegend
	x, y := 10, 0
	for i, l := range labels {
		w := 30 + 8*len([]rune(l))
		if x > 10 && x+w > svgWidth {
			x, y = 10, y+svgLegendLine // wrap
		}
		out = append(out, svgLegend{X: x, Y: y, Colour: colours[i], Label: l})
		x += w
	}
	return out
}

// WriteSVG draws the report as horizontal bars: a group per phase, a bar
// per system (median) with a min–max line, on a log time axis so that
// milliseconds and seconds both stay readable; then, when the file-sharing
// and block-device benchmarks ran, a chart of each's metrics the same way.
func WriteSVG(w io.Writer, rep Report) error {
	c := svgChart{
		Width:     svgWidth,
		Title:     "cowork-vmm start-up phases",
		Subtitle:  fmt.Sprintf("%d run(s) per system, backend %s, %s, KVM %s%s", rep.Runs, rep.Backend, rep.Host.Kernel, rep.Host.KVM, map[bool]string{true: " (nested: compare ratios, not absolute times)"}[rep.Host.Nested]),
		PlotLeft:  svgLabelWidth,
		PlotRight: svgWidth - svgRight,
	}
	c.AxisLabelX = (c.PlotLeft + c.PlotRight) / 2
	var labels, colours []string
	colour := map[string]string{}
	for i, s := range rep.Systems {
		colour[s.ID] = svgColours[i%len(svgColours)]
		labels, colours = append(labels, s.Label), append(colours, colour[s.ID])
	}
	var rows []svgRow
	for _, p := range Phases {
		row := svgRow{ID: p.ID, Label: p.Label}
		for _, s := range rep.Systems {
			if pr := s.phase(p.ID); pr != nil {
				row.Bars = append(row.Bars, svgValue{System: s.ID, Colour: colour[s.ID], Min: pr.MinMS, Median: pr.MedianMS, Max: pr.MaxMS, Text: fmtMS(pr.MedianMS)})
			}
		}
		rows = append(rows, row)
	}
	y := c.addPanel(svgTop-22, "", legendRow(labels, colours), rows) // legend at 48, bars from svgTop+10
	for _, s := range rep.ioSections() {
		y = c.addFSPanel(y, s)
	}
	y = c.addWorkPanels(y, rep.Work)
	c.Height = y
	if err := svgTemplate.Execute(w, c); err != nil {
		return fmt.Errorf("writing the SVG chart: %w", err)
	}
	return nil
}

// addFSPanel draws a file-sharing or block-device section's metrics
// below y.
func (c *svgChart) addFSPanel(y int, fs *FSReport) int {
	var labels, colours []string
	colour := map[string]string{}
	for i, s := range fs.Systems {
		if len(s.Metrics) == 0 {
			continue
		}
		colour[s.ID] = svgColours[i%len(svgColours)]
		labels, colours = append(labels, s.Label), append(colours, colour[s.ID])
	}
	var rows []svgRow
	for _, m := range fs.Metrics {
		row := svgRow{ID: m.ID, Label: m.Label}
		for _, s := range fs.Systems {
			if mr := s.metric(m.ID); mr != nil {
				text := fmtMS(mr.MedianMS)
				if mr.MedianMBs > 0 {
					text = fmt.Sprintf("%.1f MB/s", mr.MedianMBs)
				}
				row.Bars = append(row.Bars, svgValue{System: s.ID, Colour: colour[s.ID], Min: mr.MinMS, Median: mr.MedianMS, Max: mr.MaxMS, Text: text})
			}
		}
		rows = append(rows, row)
	}
	return c.addPanel(y, fs.Title+": "+fs.Sizes, legendRow(labels, colours), rows)
}

func fmtTick(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	case v >= 1:
		return fmt.Sprintf("%gms", v)
	default:
		return fmt.Sprintf("%gµs", v*1000)
	}
}

// workFigures are the work section's charts: each a per-op figure of
// every system (median; line: min–max over the runs).
var workFigures = []struct {
	heading, axis string
	value         func(WorkSampleReport) (float64, bool)
	median        func(*WorkOpReport) (float64, bool)
}{
	{"Work: KVM exits per operation (all reasons)", "KVM exits per op, log scale (bar: median; line: min–max)",
		func(s WorkSampleReport) (float64, bool) { v, ok := s.ExitsPerOp["exits"]; return v, ok },
		func(o *WorkOpReport) (float64, bool) { return o.exits("exits") }},
	{"Work: I/O-driven exits (io+mmio) per operation", "io+mmio exits per op, log scale (bar: median; line: min–max)",
		func(s WorkSampleReport) (float64, bool) { v, ok := s.ExitsPerOp[IOExitsKey]; return v, ok },
		func(o *WorkOpReport) (float64, bool) { return o.exits(IOExitsKey) }},
	{"Work: the VMM's CPU time per operation (qemu + virtiofsd both counted)", "CPU ms per op, log scale (bar: median; line: min–max)",
		func(s WorkSampleReport) (float64, bool) { return s.CPUMSPerOp, s.CPUErr == "" },
		func(o *WorkOpReport) (float64, bool) { return o.cpu() }},
}

// addWorkPanels draws the work section's charts below y.
func (c *svgChart) addWorkPanels(y int, r *WorkReport) int {
	if r == nil {
		return y
	}
	var labels, colours []string
	colour := map[string]string{}
	for i, s := range r.Systems {
		colour[s.ID] = svgColours[i%len(svgColours)]
		labels, colours = append(labels, s.Label), append(colours, colour[s.ID])
	}
	for _, f := range workFigures {
		var rows []svgRow
		for _, op := range allOps(r) {
			row := svgRow{ID: op, Label: workOp(op).Label + " (per " + workOp(op).Unit + ")"}
			for _, s := range r.Systems {
				o := s.op(op)
				if o == nil {
					continue
				}
				med, ok := f.median(o)
				if !ok || med <= 0 {
					continue
				}
				lo, hi := med, med
				for _, smp := range o.Samples {
					if v, ok := f.value(smp); ok && v > 0 {
						lo, hi = math.Min(lo, v), math.Max(hi, v)
					}
				}
				row.Bars = append(row.Bars, svgValue{System: s.ID, Colour: colour[s.ID], Min: lo, Median: med, Max: hi, Text: fmtCount(med)})
			}
			rows = append(rows, row)
		}
		y = c.addPanelAxis(y, f.heading, legendRow(labels, colours), rows, f.axis, fmtCountTick)
	}
	return y
}

func fmtCountTick(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
