package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

// WorkOp is an operation whose work the report gives per Unit.
type WorkOp struct {
	ID, Label string
	Unit      string // what one op is: "boot", "MiB read", "walk" …
}

// WorkOps are the operations measured, in report order (an op recorded
// that is not here is reported under its id, after these). The boot
// bench's: a boot to /init, the agent's connection (ours only: qemu's
// guest has no agent) and a spawn; the file-sharing bench's workloads, by
// fsbench metric id.
var WorkOps = []WorkOp{
	{ID: WorkBoot, Label: "start → /init", Unit: "boot"},
	{ID: WorkConnect, Label: "/init → agent connected", Unit: "connect"},
	{ID: WorkStartConnected, Label: "startVM → agent connected", Unit: "start"},
	{ID: WorkSpawn, Label: "spawn /bin/true → exit event", Unit: "spawn"},
	{ID: "seq_write", Label: "sequential write + fsync", Unit: "MiB written"},
	{ID: "seq_read", Label: "sequential read, cache dropped", Unit: "MiB read"},
	{ID: "rand_read", Label: "4 KiB random reads, cache dropped", Unit: "read"},
	{ID: "walk_cold", Label: "tree walk, cold", Unit: "walk"},
	{ID: "walk_warm", Label: "tree walk, warm", Unit: "walk"},
	{ID: "git_cold", Label: "git status, cold", Unit: "git status"},
	{ID: "git_warm", Label: "git status, warm", Unit: "git status"},
	{ID: "python_cold", Label: "python3 start, cold", Unit: "start"},
	{ID: "python_warm", Label: "python3 start, warm", Unit: "start"},
	{ID: fsbench.MarkEmpty, Label: "an empty window: the guest's marks themselves", Unit: "window"},
	{ID: "sdk_print_cold", Label: "claude -p turn, cold (real CLI)", Unit: "turn"},
	{ID: "sdk_print_warm", Label: "claude -p turn, warm (real CLI)", Unit: "turn"},
	{ID: "sdk_stream_cold", Label: "stream-json turn, cold (real CLI)", Unit: "turn"},
	{ID: "sdk_stream_warm", Label: "stream-json turn, warm (real CLI)", Unit: "turn"},
}

// The boot bench's operations.
const (
	WorkBoot    = "boot"
	WorkConnect = "connect"
	WorkSpawn   = "spawn"
	// WorkStartConnected spans both (a warm start, restored from its
	// snapshot, has no boot to /init).
	WorkStartConnected = "start_to_connected"
)

func workOp(id string) WorkOp {
	for _, op := range WorkOps {
		if op.ID == id {
			return op
		}
	}
	return WorkOp{ID: id, Label: id, Unit: "op"}
}

// WorkComparisons are the pairs the report gives ratios of (ours first):
// each of ours against the peers that ran the same operations.
var WorkComparisons = [][2]string{
	{SystemOurs, SystemQemuMicro}, {SystemOurs, SystemQemuQ35}, {SystemOurs, SystemQemuQ35OVMF},
	{"ours-virtiofs", "qemu-virtiofsd"}, {"ours-virtiofs", "qemu-9p"}, {"ours-9p", "qemu-9p"},
	{"ours-blk", "qemu-blk"},
}

// WorkResults accumulates the work of every run, by system and operation.
type WorkResults struct {
	order  []string
	labels map[string]string
	runs   map[string]map[string][]WorkRun
	notes  []string
}

// WorkRun is one run's work for an operation done Units times.
type WorkRun struct {
	Units float64
	Work  Work
}

// NewWorkResults returns empty work results.
func NewWorkResults() *WorkResults {
	return &WorkResults{labels: map[string]string{}, runs: map[string]map[string][]WorkRun{}}
}

// Add records that system did op units times (a MiB count, a number of
// reads, 1 for a boot) for w. Units ≤ 0 records nothing.
func (r *WorkResults) Add(system, label, op string, units float64, w Work) {
	if units <= 0 {
		return
	}
	if _, ok := r.runs[system]; !ok {
		r.order = append(r.order, system)
		r.labels[system] = label
		r.runs[system] = map[string][]WorkRun{}
	}
	r.runs[system][op] = append(r.runs[system][op], WorkRun{Units: units, Work: w})
}

// Note adds a note to the report's work section.
func (r *WorkResults) Note(n string) {
	if !slices.Contains(r.notes, n) {
		r.notes = append(r.notes, n)
	}
}

// WorkReport is the report's work section.
type WorkReport struct {
	Counters []ExitCounter      `json:"counters"`
	Systems  []WorkSystemReport `json:"systems"`
	Ratios   []WorkRatioReport  `json:"ratios,omitempty"`
	Targets  []WorkTargetReport `json:"targets,omitempty"`
	Notes    []string           `json:"notes,omitempty"`
}

// WorkSystemReport is one system's work per operation.
type WorkSystemReport struct {
	ID    string         `json:"id"`
	Label string         `json:"label"`
	Ops   []WorkOpReport `json:"ops"`
}

// WorkOpReport is one operation's work on one system: medians over the
// runs of the per-op figures (a run's counts over its units).
type WorkOpReport struct {
	ID    string  `json:"id"`
	Label string  `json:"label"`
	Unit  string  `json:"unit"`
	Runs  int     `json:"runs"`
	Units float64 `json:"units_per_run"`
	// ExitsPerOp by counter name and IOExitsKey; nil, with
	// ExitsNotMeasured saying why, when no run measured them.
	ExitsPerOp       map[string]float64 `json:"exits_per_op,omitempty"`
	ExitsNotMeasured string             `json:"exits_not_measured,omitempty"`
	// CPUMSPerOp is the VMM's processes' user + system time,
	// GuestCPUMSPerOp the part of it their vCPUs ran the guest, and
	// VMMCPUMSPerOp the rest: the VMM's own work.
	CPUMSPerOp      float64 `json:"cpu_ms_per_op"`
	GuestCPUMSPerOp float64 `json:"guest_cpu_ms_per_op"`
	VMMCPUMSPerOp   float64 `json:"vmm_cpu_ms_per_op"`
	CPUNotMeasured  string  `json:"cpu_not_measured,omitempty"`
	WallMSPerOp     float64 `json:"wall_ms_per_op"`
	// Net says the work of the system's empty window (its marks' own
	// cost, fsbench.MarkEmpty) was taken off every run before dividing.
	Net bool `json:"net_of_marks,omitempty"`
	// Samples are the runs' per-op figures.
	Samples []WorkSampleReport `json:"samples"`
}

// WorkSampleReport is one run's work per op.
type WorkSampleReport struct {
	Units           float64            `json:"units"`
	ExitsPerOp      map[string]float64 `json:"exits_per_op,omitempty"`
	ExitsErr        string             `json:"exits_err,omitempty"`
	CPUMSPerOp      float64            `json:"cpu_ms_per_op"`
	GuestCPUMSPerOp float64            `json:"guest_cpu_ms_per_op"`
	CPUErr          string             `json:"cpu_err,omitempty"`
	WallMS          float64            `json:"wall_ms"`
}

// WorkRatioReport is ours over a peer for one operation (below 1: ours
// does less work); a ratio either side lacks is left out (zero).
type WorkRatioReport struct {
	Op      string  `json:"op"`
	System  string  `json:"system"`
	Versus  string  `json:"versus"`
	Exits   float64 `json:"exits,omitempty"`
	IOExits float64 `json:"io_exits,omitempty"`
	CPU     float64 `json:"cpu,omitempty"`
	VMMCPU  float64 `json:"vmm_cpu,omitempty"`
}

// perOp is one run's work, less base (nil: nothing), divided by its
// units; a count below base's is 0, and IOExitsKey is the sum of the net
// I/O-driven counters.
func (w WorkRun) perOp(base *Work) WorkSampleReport {
	s := WorkSampleReport{Units: w.Units, ExitsErr: w.Work.ExitsErr, CPUErr: w.Work.CPUErr, WallMS: ms(w.Work.Wall)}
	var b Work
	if base != nil {
		b = *base
	}
	if w.Work.Exits != nil {
		s.ExitsPerOp = make(map[string]float64, len(w.Work.Exits))
		var io int64
		for _, c := range ExitCounters {
			v, ok := w.Work.Exits[c.Name]
			if !ok {
				continue
			}
			net := max(0, v-b.Exits[c.Name])
			s.ExitsPerOp[c.Name] = roundSig(float64(net) / w.Units)
			if c.IODriven {
				io += net
			}
		}
		s.ExitsPerOp[IOExitsKey] = roundSig(float64(io) / w.Units)
	}
	if w.Work.CPUErr == "" {
		perOp := func(d time.Duration) float64 {
			return roundSig(float64(max(0, d)) / float64(time.Millisecond) / w.Units)
		}
		s.CPUMSPerOp = perOp(w.Work.CPU - b.CPU)
		s.GuestCPUMSPerOp = min(s.CPUMSPerOp, perOp(w.Work.GuestCPU-b.GuestCPU))
	}
	return s
}

// roundSig keeps four significant digits.
func roundSig(v float64) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	scale := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(v))))
	return math.Round(v*scale) / scale
}

// medianFloat is the median of v (the mean of the middle two of an even
// count); NaN for none.
func medianFloat(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// opReport summarises one system's runs of op, each less base (nil:
// nothing).
func opReport(op string, runs []WorkRun, base *Work) WorkOpReport {
	info := workOp(op)
	r := WorkOpReport{ID: op, Label: info.Label, Unit: info.Unit, Runs: len(runs), Net: base != nil}
	var units, cpu, guest, vmm, wall []float64
	exits := map[string][]float64{}
	for _, run := range runs {
		s := run.perOp(base)
		r.Samples = append(r.Samples, s)
		units = append(units, s.Units)
		wall = append(wall, s.WallMS/s.Units)
		if s.CPUErr == "" {
			cpu, guest, vmm = append(cpu, s.CPUMSPerOp), append(guest, s.GuestCPUMSPerOp), append(vmm, s.CPUMSPerOp-s.GuestCPUMSPerOp)
		} else {
			r.CPUNotMeasured = s.CPUErr
		}
		if s.ExitsPerOp == nil {
			r.ExitsNotMeasured = s.ExitsErr
		}
		for k, v := range s.ExitsPerOp {
			exits[k] = append(exits[k], v)
		}
	}
	r.Units = medianFloat(units)
	r.WallMSPerOp = roundSig(medianFloat(wall))
	if len(cpu) > 0 {
		r.CPUMSPerOp, r.CPUNotMeasured = roundSig(medianFloat(cpu)), ""
		r.GuestCPUMSPerOp, r.VMMCPUMSPerOp = roundSig(medianFloat(guest)), roundSig(medianFloat(vmm))
	}
	if len(exits) > 0 {
		r.ExitsPerOp, r.ExitsNotMeasured = map[string]float64{}, ""
		for k, v := range exits {
			r.ExitsPerOp[k] = roundSig(medianFloat(v))
		}
	}
	return r
}

// marksBaseline is the median work of a system's empty windows (the
// guest's marks' own cost: their console output, our in-process VMM's
// sampling), or nil when it has none.
func marksBaseline(runs map[string][]WorkRun) *Work {
	empty := runs[fsbench.MarkEmpty]
	if len(empty) == 0 {
		return nil
	}
	var cpu, guest []float64
	exits := map[string][]float64{}
	for _, r := range empty {
		if r.Work.CPUErr == "" {
			cpu, guest = append(cpu, float64(r.Work.CPU)), append(guest, float64(r.Work.GuestCPU))
		}
		for k, v := range r.Work.Exits {
			exits[k] = append(exits[k], float64(v))
		}
	}
	base := &Work{Exits: map[string]int64{}}
	if len(cpu) > 0 {
		base.CPU, base.GuestCPU = time.Duration(medianFloat(cpu)), time.Duration(medianFloat(guest))
	}
	for k, v := range exits {
		base.Exits[k] = int64(medianFloat(v))
	}
	return base
}

// Report summarises the work results; nil when nothing was recorded.
func (r *WorkResults) Report() *WorkReport {
	if r == nil || len(r.order) == 0 {
		return nil
	}
	rep := &WorkReport{Counters: ExitCounters, Notes: r.notes}
	for _, id := range r.order {
		sr := WorkSystemReport{ID: id, Label: r.labels[id]}
		base := marksBaseline(r.runs[id])
		for _, op := range opOrder(r.runs[id]) {
			if op == fsbench.MarkEmpty {
				sr.Ops = append(sr.Ops, opReport(op, r.runs[id][op], nil))
			} else {
				sr.Ops = append(sr.Ops, opReport(op, r.runs[id][op], base))
			}
		}
		rep.Systems = append(rep.Systems, sr)
	}
	rep.Ratios = workRatios(rep.Systems)
	rep.Targets = workTargetReports(rep.Systems)
	return rep
}

// opOrder is the ops of runs in WorkOps order, others after, by id.
func opOrder(runs map[string][]WorkRun) []string {
	var out, others []string
	for _, op := range WorkOps {
		if _, ok := runs[op.ID]; ok {
			out = append(out, op.ID)
		}
	}
	for id := range runs {
		if !slices.Contains(out, id) {
			others = append(others, id)
		}
	}
	slices.Sort(others)
	return append(out, others...)
}

func (r *WorkReport) system(id string) *WorkSystemReport {
	for i := range r.Systems {
		if r.Systems[i].ID == id {
			return &r.Systems[i]
		}
	}
	return nil
}

func (s *WorkSystemReport) op(id string) *WorkOpReport {
	if s == nil {
		return nil
	}
	for i := range s.Ops {
		if s.Ops[i].ID == id {
			return &s.Ops[i]
		}
	}
	return nil
}

// workRatios compares each pair of WorkComparisons on every op both ran.
func workRatios(systems []WorkSystemReport) []WorkRatioReport {
	rep := &WorkReport{Systems: systems}
	var out []WorkRatioReport
	for _, pair := range WorkComparisons {
		ours, peer := rep.system(pair[0]), rep.system(pair[1])
		if ours == nil || peer == nil {
			continue
		}
		for _, o := range ours.Ops {
			p := peer.op(o.ID)
			if p == nil {
				continue
			}
			rr := WorkRatioReport{Op: o.ID, System: ours.ID, Versus: peer.ID,
				Exits: ratioOf(o.exits, p.exits, "exits"), IOExits: ratioOf(o.exits, p.exits, IOExitsKey),
				CPU: ratioOf(o.cpuOf, p.cpuOf, figureCPU), VMMCPU: ratioOf(o.cpuOf, p.cpuOf, figureVMMCPU)}
			if rr.Exits != 0 || rr.IOExits != 0 || rr.CPU != 0 {
				out = append(out, rr)
			}
		}
	}
	return out
}

// exits is op's per-op median of counter, ok false when not measured.
func (o *WorkOpReport) exits(counter string) (float64, bool) {
	if o == nil || o.ExitsPerOp == nil {
		return 0, false
	}
	v, ok := o.ExitsPerOp[counter]
	return v, ok
}

func (o *WorkOpReport) cpu() (float64, bool) { return o.cpuOf(figureCPU) }

// cpuOf is op's per-op median CPU time (figureCPU: all of it;
// figureVMMCPU: without the guest's), ok false when not measured.
func (o *WorkOpReport) cpuOf(figure string) (float64, bool) {
	if o == nil || o.CPUNotMeasured != "" || o.Runs == 0 {
		return 0, false
	}
	if figure == figureVMMCPU {
		return o.VMMCPUMSPerOp, true
	}
	return o.CPUMSPerOp, true
}

// ratioOf is ours(key)/theirs(key) rounded, 0 when either is missing or
// theirs is 0.
func ratioOf(ours, theirs func(key string) (float64, bool), key string) float64 {
	a, aok := ours(key)
	b, bok := theirs(key)
	if !aok || !bok || b <= 0 {
		return 0
	}
	return roundRatio(a / b)
}

// fmtCount formats a per-op count: integers plainly, small figures with
// their significant digits.
func fmtCount(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// workColumns are the counters the Markdown table shows (the JSON has all
// of ExitCounters).
var workColumns = []string{"exits", IOExitsKey, "pf_taken", "insn_emulation", "halt_exits", "irq_exits", "irq_window_exits"}

// writeWorkMarkdown writes the work section: a row per system and op with
// the exits by reason and the CPU time per op, the ratios ours/peer, what
// each counter scales with, the targets and the notes.
func writeWorkMarkdown(b *strings.Builder, r *WorkReport) {
	if r == nil {
		return
	}
	b.WriteString("### Work per operation: KVM exits by reason and the VMM's CPU time\n\n")
	b.WriteString("What a real host pays, nearly independent of the emulator's speed: KVM's counters for the VMM's VMs (debugfs, summed over vCPUs) and the CPU time (user + system, /proc/PID/stat, 10 ms ticks) of the VMM's processes (qemu + virtiofsd both counted; ours in the file-sharing rows is the bench process, which runs our VMM in-process), per op: medians over the runs of each run's count over its ops. " +
		"The CPU time includes the guest's: Linux counts a vCPU thread's time in the guest as the VMM's user time; \"guest\" is that part, \"VMM own\" the rest. " +
		"File-sharing rows are net of the system's empty window (the guest's marks around each workload cost a few dozen port-I/O exits of console output; that row is shown as it was measured). " +
		"Where a window starts and ends: a boot at startVM (qemu: its exec) and at the boot timer's byte; the file-sharing workloads at the guest's marks, which our in-process VMM sees as the guest writes them and qemu's console pipe delivers a little later, so a qemu window may hold a few ms of what the guest does next.\n\n")
	header := append([]string{"operation", "system", "runs"}, workColumns...)
	header = append(header, "CPU ms", "guest CPU ms", "VMM own CPU ms", "wall ms")
	writeRow(b, header)
	writeRow(b, append([]string{"---", "---"}, slices.Repeat([]string{"---:"}, len(header)-2)...))
	for _, op := range allOps(r) {
		for _, s := range r.Systems {
			o := s.op(op)
			if o == nil {
				continue
			}
			row := []string{o.Label + " (per " + o.Unit + ")", s.Label, fmt.Sprint(o.Runs)}
			for _, c := range workColumns {
				if v, ok := o.exits(c); ok {
					row = append(row, fmtCount(v))
				} else {
					row = append(row, "—")
				}
			}
			if _, ok := o.cpu(); ok {
				row = append(row, fmtCount(o.CPUMSPerOp), fmtCount(o.GuestCPUMSPerOp), fmtCount(o.VMMCPUMSPerOp))
			} else {
				row = append(row, "—", "—", "—")
			}
			row = append(row, fmtCount(o.WallMSPerOp))
			writeRow(b, row)
		}
	}
	b.WriteString("\n")
	writeWorkRatios(b, r)
	writeWorkScales(b, r)
	writeWorkTargets(b, r.Targets)
	for _, s := range r.Systems {
		for _, o := range s.Ops {
			if o.ExitsNotMeasured != "" {
				fmt.Fprintf(b, "- %s, %s: exits %s\n", s.Label, o.Label, notMeasured(o.ExitsNotMeasured))
			}
			if o.CPUNotMeasured != "" {
				fmt.Fprintf(b, "- %s, %s: CPU time %s\n", s.Label, o.Label, notMeasured(o.CPUNotMeasured))
			}
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(b, "- %s\n", n)
	}
	b.WriteString("\n")
}

// notMeasured prefixes why with "not measured: " unless it says so.
func notMeasured(why string) string {
	if strings.HasPrefix(why, "not measured") {
		return why
	}
	return "not measured: " + why
}

// allOps is every op some system of r has, in report order.
func allOps(r *WorkReport) []string {
	seen := map[string][]WorkRun{}
	for _, s := range r.Systems {
		for _, o := range s.Ops {
			seen[o.ID] = nil
		}
	}
	return opOrder(seen)
}

// writeWorkRatios writes the ratios ours/peer, a row per op and pair.
func writeWorkRatios(b *strings.Builder, r *WorkReport) {
	if len(r.Ratios) == 0 {
		return
	}
	writeRow(b, []string{"operation", "ours / peer", "exits", IOExitsKey + " exits", "CPU", "VMM own CPU"})
	writeRow(b, []string{"---", "---", "---:", "---:", "---:", "---:"})
	for _, op := range allOps(r) {
		for _, rr := range r.Ratios {
			if rr.Op != op {
				continue
			}
			writeRow(b, []string{workOp(op).Label, rr.System + " / " + rr.Versus,
				fmtRatio(rr.Exits, rr.Exits > 0), fmtRatio(rr.IOExits, rr.IOExits > 0), fmtRatio(rr.CPU, rr.CPU > 0), fmtRatio(rr.VMMCPU, rr.VMMCPU > 0)})
		}
	}
	b.WriteString("\n")
}

// writeWorkScales says which counters grow with wall time and which with
// work.
func writeWorkScales(b *strings.Builder, r *WorkReport) {
	var wall, work []string
	for _, c := range r.Counters {
		switch c.Scales {
		case ScalesWall:
			wall = append(wall, c.Name)
		case ScalesWork:
			work = append(work, c.Name)
		}
	}
	fmt.Fprintf(b, "- Scale with the work asked of the VMM (the same on any host): %s. %s is io_exits + mmio_exits, the exits to the VMM in user space; a kick an ioeventfd takes in the kernel counts in exits and pf_taken or insn_emulation instead.\n", strings.Join(work, ", "), IOExitsKey)
	fmt.Fprintf(b, "- Scale with wall time (the host's timer ticks, the guest's idle halts and timer interrupts: nested, the emulator stretches every operation, so these overstate a real host's): %s.\n", strings.Join(wall, ", "))
}
