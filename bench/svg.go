package bench

import (
	"fmt"
	"io"
	"math"
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
	Width, Height  int
	Title          string
	Subtitle       string
	PlotLeft       int
	PlotRight      int
	PlotTop        int
	AxisY          int
	Legend         []svgLegend
	Groups         []svgGroup
	Ticks          []svgTick
	AxisLabelY     int
	AxisLabelX     int
	GroupSeparator []int
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
<text x="10" y="38" fill="#444444">{{html .Subtitle}}</text>
<g class="legend">{{range .Legend}}
<rect x="{{.X}}" y="{{.Y}}" width="12" height="12" fill="{{.Colour}}"/><text x="{{printf "%d" (add .X 16)}}" y="{{printf "%d" (add .Y 11)}}">{{html .Label}}</text>{{end}}
</g>
<g class="grid" stroke="#dddddd">{{range .Ticks}}
<line x1="{{printf "%.1f" .X}}" y1="{{$.PlotTop}}" x2="{{printf "%.1f" .X}}" y2="{{$.AxisY}}"/>{{end}}
</g>
<g class="groups">{{range .Groups}}
<text x="{{printf "%d" (sub $.PlotLeft 8)}}" y="{{.LabelY}}" text-anchor="end">{{html .Label}}</text>{{range .Bars}}
<rect class="bar" data-phase="{{html .Phase}}" data-system="{{html .System}}" x="{{printf "%.1f" .X}}" y="{{printf "%.1f" .Y}}" width="{{printf "%.1f" .W}}" height="{{printf "%.1f" .H}}" fill="{{.Colour}}"><title>{{html .System}}: {{html .Value}}</title></rect>
<line class="whisker" x1="{{printf "%.1f" .WhiskerX1}}" y1="{{printf "%.1f" .WhiskerY}}" x2="{{printf "%.1f" .WhiskerX2}}" y2="{{printf "%.1f" .WhiskerY}}" stroke="#222222" stroke-width="1"/>
<text x="{{printf "%.1f" .ValueX}}" y="{{printf "%.1f" .ValueY}}" font-size="10" fill="#222222">{{html .Value}}</text>{{end}}{{end}}
</g>
<g class="axis">
<line x1="{{.PlotLeft}}" y1="{{.AxisY}}" x2="{{.PlotRight}}" y2="{{.AxisY}}" stroke="#000000"/>{{range .Ticks}}
<line x1="{{printf "%.1f" .X}}" y1="{{$.AxisY}}" x2="{{printf "%.1f" .X}}" y2="{{printf "%d" (add $.AxisY 5)}}" stroke="#000000"/>
<text x="{{printf "%.1f" .X}}" y="{{printf "%d" (add $.AxisY 18)}}" text-anchor="middle">{{html .Label}}</text>{{end}}
<text x="{{.AxisLabelX}}" y="{{.AxisLabelY}}" text-anchor="middle">time, log scale (bar: median; line: min–max)</text>
</g>
</svg>
`))

// WriteSVG draws the report as horizontal bars: a group per phase, a bar
// per system (median) with a min–max line, on a log time axis so that
// milliseconds and seconds both stay readable.
func WriteSVG(w io.Writer, rep Report) error {
	c := svgChart{
		Width:     svgWidth,
		Title:     "cowork-vmm start-up phases",
		Subtitle:  fmt.Sprintf("%d run(s) per system, backend %s, %s, KVM %s%s", rep.Runs, rep.Backend, rep.Host.Kernel, rep.Host.KVM, map[bool]string{true: " (nested: compare ratios, not absolute times)"}[rep.Host.Nested]),
		PlotLeft:  svgLabelWidth,
		PlotRight: svgWidth - svgRight,
		PlotTop:   svgTop,
	}
	colour := map[string]string{}
	x := 10
	for i, s := range rep.Systems {
		colour[s.ID] = svgColours[i%len(svgColours)]
		c.Legend = append(c.Legend, svgLegend{X: x, Y: 48, Colour: colour[s.ID], Label: s.Label})
		x += 30 + 8*len([]rune(s.Label))
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range rep.Systems {
		for _, p := range s.Phases {
			lo = math.Min(lo, p.MinMS)
			hi = math.Max(hi, p.MaxMS)
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
		c.Ticks = append(c.Ticks, svgTick{X: scale(math.Pow(10, d)), Label: fmtTick(math.Pow(10, d))})
	}
	y := svgTop + 10
	for _, p := range Phases {
		var bars []svgBar
		for _, s := range rep.Systems {
			pr := s.phase(p.ID)
			if pr == nil {
				continue
			}
			by := float64(y + len(bars)*(svgBarHeight+svgBarGap))
			end := scale(pr.MedianMS)
			bars = append(bars, svgBar{
				Phase: p.ID, System: s.ID, Colour: colour[s.ID],
				X: float64(c.PlotLeft), Y: by, W: math.Max(end-float64(c.PlotLeft), 1), H: svgBarHeight,
				WhiskerX1: scale(pr.MinMS), WhiskerX2: scale(pr.MaxMS), WhiskerY: by + svgBarHeight/2,
				ValueX: math.Max(end, scale(pr.MaxMS)) + 4, ValueY: by + svgBarHeight - 3,
				Value: fmtMS(pr.MedianMS),
			})
		}
		if len(bars) == 0 {
			continue
		}
		h := len(bars)*(svgBarHeight+svgBarGap) - svgBarGap
		c.Groups = append(c.Groups, svgGroup{Label: p.Label, LabelY: y + h/2 + 4, Bars: bars})
		y += h + svgGroupGap
	}
	c.AxisY = y
	c.AxisLabelX = (c.PlotLeft + c.PlotRight) / 2
	c.AxisLabelY = y + 36
	c.Height = y + svgAxisHeight
	if err := svgTemplate.Execute(w, c); err != nil {
		return fmt.Errorf("writing the SVG chart: %w", err)
	}
	return nil
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
