package nested

// A frozen outer guest.
//
// On these machines (qemu 7.2, TCG, nested SVM) the outer guest sometimes
// stops for good while a nested VM runs: qemu's vCPU thread waits for an
// interrupt that never comes, qemu uses no CPU at all, the guest's own
// timers never fire again, so the tests' timeouts inside it never fire
// either (seen 4 times in 8 runs on 2026-12-05, at random points, at this
// tree and at the one before it; never in a 6-minute run without a nested
// VM; the outer kernel's idle=poll did not prevent it). Only the run's
// whole deadline ended it, after 25 minutes and with no result. A healthy
// outer guest is never that still: its vCPU runs the nested VM's and its
// own timers. So the harness watches qemu's CPU time, ends a run in which
// qemu has used almost none for freezeWindow (ErrOuterFroze), and
// RunThroughFreezes runs such a run again.
//
// It can also stop while qemu keeps a CPU busy: on 2026-12-06 a CI run's
// outer guest printed nothing for 20 minutes after a nested VM started two
// busy loops, and its own 20-minute payload timeout never fired, so its
// kernel no longer kept time. outerinit therefore prints a heartbeat
// (job.MarkerAlive) every job.AliveInterval while the payload runs, and a
// run whose heartbeat stops for stallWindow counts as frozen too.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// ErrOuterFroze: qemu used (almost) no CPU for a whole freezeWindow, or
// the payload's heartbeat stopped for stallWindow.
var ErrOuterFroze = errors.New("the outer guest froze")

const (
	// freezeWindow is how long qemu must be still to count as frozen, and
	// freezeCPU the CPU time that still counts as still.
	freezeWindow = 90 * time.Second
	freezeCPU    = 100 * time.Millisecond
	// freezeSample is how often qemu's CPU time is read.
	freezeSample = 5 * time.Second
	// stallWindow is how long the heartbeat may be missing: nine beats.
	stallWindow = 9 * job.AliveInterval
	// clockTick is USER_HZ, the unit of /proc/<pid>/stat's times.
	clockTick = 10 * time.Millisecond
)

// cpuWatch says whether a process has been still for a window.
type cpuWatch struct {
	window, min time.Duration
	samples     []cpuSample // oldest first, covering at least window
}

type cpuSample struct {
	at  time.Time
	cpu time.Duration
}

// add records the process's CPU time cpu at at and says whether it used
// less than min over the last window.
func (w *cpuWatch) add(at time.Time, cpu time.Duration) bool {
	w.samples = append(w.samples, cpuSample{at, cpu})
	// Keep one sample at least window old, the newest such.
	for len(w.samples) > 1 && at.Sub(w.samples[1].at) >= w.window {
		w.samples = w.samples[1:]
	}
	first := w.samples[0]
	return at.Sub(first.at) >= w.window && cpu-first.cpu < w.min
}

// processCPU reads the user and system CPU time of process pid.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses: fields follow its
	// last ')'. utime and stime are fields 14 and 15, the 12th and 13th
	// after it.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// everySample calls check every sample until ctx ends or check reports
// done.
func everySample(ctx context.Context, sample time.Duration, check func(now time.Time) (done bool)) {
	tick := time.NewTicker(sample)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if check(now) {
				return
			}
		}
	}
}

// watchFreeze samples process pid's CPU time every sample until ctx ends,
// and calls frozen (once) when it has used less than min over window.
func watchFreeze(ctx context.Context, pid int, window, min, sample time.Duration, frozen func()) {
	w := &cpuWatch{window: window, min: min}
	everySample(ctx, sample, func(now time.Time) bool {
		cpu, err := processCPU(pid)
		if err != nil {
			return true // gone
		}
		if w.add(now, cpu) {
			frozen()
			return true
		}
		return false
	})
}

// markerWatch notes when a marker line appears in the console stream: the
// first and the latest time. Writes come serialised (lockedWriter); seen
// may be called from another goroutine.
type markerWatch struct {
	start  time.Time
	marker []byte
	recent []byte // the stream's tail, long enough to hold a split marker

	mu          sync.Mutex
	first, last time.Duration // since start; zero until seen
}

func (m *markerWatch) Write(p []byte) (int, error) {
	m.recent = append(m.recent, p...)
	if bytes.Contains(m.recent, m.marker) {
		now := time.Since(m.start)
		m.mu.Lock()
		if m.first == 0 {
			m.first = now
		}
		m.last = now
		m.mu.Unlock()
		m.recent = m.recent[:0]
		return len(p), nil
	}
	if keep := len(m.marker); len(m.recent) > keep {
		m.recent = append(m.recent[:0], m.recent[len(m.recent)-keep:]...)
	}
	return len(p), nil
}

// seen returns the first and the latest time the marker appeared.
func (m *markerWatch) seen() (first, last time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.first, m.last
}

// watchHeartbeat checks every sample, once begin has been seen, that begin
// or a heartbeat appeared within window, and calls stalled (once) with how
// long none has.
func watchHeartbeat(ctx context.Context, begin, alive *markerWatch, window, sample time.Duration, stalled func(silent time.Duration)) {
	everySample(ctx, sample, func(time.Time) bool {
		began, _ := begin.seen()
		if began == 0 {
			return false
		}
		_, beat := alive.seen()
		silent := time.Since(begin.start) - max(began, beat)
		if silent < window {
			return false
		}
		stalled(silent)
		return true
	})
}
