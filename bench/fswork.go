package bench

import (
	"sync"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsrun"
)

// fsWork collects one file-sharing run's work per metric from the guest's
// marks (fsrun.FSBench.OnMark): a sample at a metric's begin mark, another
// at its end mark.
type fsWork struct {
	meter WorkMeter

	mu    sync.Mutex
	begun map[string]WorkSample
	done  map[string]Work
}

func newFSWork(meter WorkMeter) *fsWork {
	return &fsWork{meter: meter, begun: map[string]WorkSample{}, done: map[string]Work{}}
}

// onMark samples the marking system's processes (mark).
func (f *fsWork) onMark(m fsrun.Mark) { f.mark(m.Metric, m.Begin, m.PIDs) }

// mark samples pids at the beginning or the end of op's window: a begin
// reads the CPU times last and an end first, so that reading debugfs
// costs the window nothing. Any guest mode that marks its operations
// (the SDK turns) can record through it.
func (f *fsWork) mark(op string, begin bool, pids []int) {
	if begin {
		s := f.meter.Sample(pids...)
		f.mu.Lock()
		f.begun[op] = s
		f.mu.Unlock()
		return
	}
	end := f.meter.SampleCPUFirst(pids...)
	f.mu.Lock()
	defer f.mu.Unlock()
	if begin, ok := f.begun[op]; ok {
		f.done[op] = end.Sub(begin)
		delete(f.begun, op)
	}
}

// take returns the work of the metrics measured so far and forgets them
// (a new run starts afresh).
func (f *fsWork) take() map[string]Work {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.done
	f.begun, f.done = map[string]WorkSample{}, map[string]Work{}
	return out
}

// fsWorkUnits is how many ops a metric's window held, from the run's
// results: MiB for the sequential I/O, reads for the random reads, the
// warm python starts, 1 for the rest; 0 when the workload failed or was
// skipped (its work is not reported).
func fsWorkUnits(metric string, results []fsbench.Result) float64 {
	if metric == fsbench.MarkEmpty {
		return 1
	}
	m, ok := fsbench.MetricByID(metric)
	if !ok {
		return 0
	}
	for _, r := range results {
		if _, _, ok := m.Of(r); !ok {
			continue
		}
		switch metric {
		case "seq_write", "seq_read":
			return float64(r.Values["bytes"]) / (1 << 20)
		case "rand_read":
			return float64(r.Values["reads"])
		case "python_warm":
			return float64(max(r.Values["warm_runs"], 1))
		}
		return 1
	}
	return 0
}

// addFSWork records one run's work per metric of system.
func (b *benchRun) addFSWork(system string, work map[string]Work, fsResults []fsbench.Result) {
	for metric, w := range work {
		units := fsWorkUnits(metric, fsResults)
		b.accounts.Add(system, guestboot.FSSystemLabel(system), metric, units, w)
		b.show.line("%s %s (%g ops): %s", system, metric, units, w)
	}
}

// bootWork is one helper or qemu run's samples at the instants of a start
// (the timeline's marks), for the work of its boot operations.
type bootWork struct {
	meter WorkMeter
	pid   int

	mu      sync.Mutex
	samples map[string]WorkSample
}

func newBootWork(meter WorkMeter, pid int) *bootWork {
	return &bootWork{meter: meter, pid: pid, samples: map[string]WorkSample{}}
}

// mark samples the process at the instant name (once); end says a window
// ends there (the CPU times are read first). A nil bootWork does nothing.
func (b *bootWork) mark(name string, end bool) {
	if b == nil {
		return
	}
	b.mu.Lock()
	_, seen := b.samples[name]
	b.mu.Unlock()
	if seen {
		return
	}
	s := b.meter.Sample(b.pid)
	if end {
		s = b.meter.SampleCPUFirst(b.pid)
	}
	b.set(name, s)
}

func (b *bootWork) set(name string, s WorkSample) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, seen := b.samples[name]; !seen {
		b.samples[name] = s
	}
}

// bootWorkOps are the boot bench's operations and the instants (timeline
// marks) each spans.
var bootWorkOps = []struct{ op, from, to string }{
	{WorkBoot, MarkStartSent, MarkInit},
	{WorkConnect, MarkInit, MarkConnected},
	{WorkStartConnected, MarkStartSent, MarkConnected},
	{WorkSpawn, MarkSpawnSent, MarkExit},
}

// ops returns the work of every operation both of whose instants were
// sampled.
func (b *bootWork) ops() map[string]Work {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]Work{}
	for _, o := range bootWorkOps {
		from, ok1 := b.samples[o.from]
		to, ok2 := b.samples[o.to]
		if ok1 && ok2 {
			out[o.op] = to.Sub(from)
		}
	}
	return out
}

// prepareWork sets up the work accounting on the kvm backend: debugfs
// mounted (mounting it when this process is root and it is not), or a note
// saying why exits are not measured (the CPU times still are).
func (b *benchRun) prepareWork() {
	if b.backend != "kvm" {
		return
	}
	b.meter = &WorkMeter{}
	if len(b.peers) > 0 {
		b.accounts.Note("the qemu peers have no agent: they boot to /init and no further, so they have no connect or spawn rows")
	}
	if why := ensureDebugfs(DebugfsRoot); why != "" {
		b.accounts.Note("KVM exits not measured: " + why)
		b.note("work accounting: KVM exits not measured: " + why)
	}
}

// addBootWork records one boot run's work per operation.
func (b *benchRun) addBootWork(system string, work map[string]Work) {
	for op, w := range work {
		b.accounts.Add(system, b.results.label(system), op, 1, w)
		b.show.line("%s %s: %s", system, op, w)
	}
}
