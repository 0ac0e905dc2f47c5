package nested

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCPUWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := &cpuWatch{window: 60 * time.Second, min: 100 * time.Millisecond}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	assert.False(t, w.add(at(0), time.Second), "no window yet")
	assert.False(t, w.add(at(30), time.Second), "still less than a window")
	assert.True(t, w.add(at(60), time.Second+50*time.Millisecond), "a whole window with 50 ms of CPU")

	w = &cpuWatch{window: 60 * time.Second, min: 100 * time.Millisecond}
	cpu := time.Second
	for s := 0; s <= 600; s += 5 {
		cpu += 20 * time.Millisecond // 0.4% of a CPU: a healthy idle guest's ticks
		require.False(t, w.add(at(s), cpu), "at %ds", s)
	}
	assert.LessOrEqual(t, len(w.samples), 14, "samples older than the window are dropped")
	// Still from 600 s on: the window's CPU falls by 20 ms a sample.
	for s := 605; s <= 635; s += 5 {
		require.False(t, w.add(at(s), cpu), "100 ms or more over the window, at %ds", s)
	}
	assert.True(t, w.add(at(640), cpu), "80 ms over the last window")
}

func TestProcessCPU(t *testing.T) {
	busy := exec.Command("sh", "-c", "i=0; while [ $i -lt 2000000 ]; do i=$((i+1)); done")
	require.NoError(t, busy.Start())
	t.Cleanup(func() { _ = busy.Process.Kill(); _ = busy.Wait() })
	time.Sleep(300 * time.Millisecond)
	cpu, err := processCPU(busy.Process.Pid)
	require.NoError(t, err)
	assert.Greater(t, cpu, 50*time.Millisecond, "a busy loop's CPU time")
	_, err = processCPU(1 << 30)
	assert.Error(t, err, "no such process")
}

// TestWatchFreeze: a sleeping process counts as frozen after the window; a
// busy one does not.
func TestWatchFreeze(t *testing.T) {
	run := func(t *testing.T, script string) bool {
		cmd := exec.Command("sh", "-c", script)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		frozen := make(chan struct{})
		watchFreeze(ctx, cmd.Process.Pid, time.Second, 100*time.Millisecond, 100*time.Millisecond, func() { close(frozen) })
		select {
		case <-frozen:
			return true
		default:
			return false
		}
	}
	assert.True(t, run(t, "exec sleep 30"), "a sleeping process is still")
	assert.False(t, run(t, "while :; do :; done"), "a busy one is not")
}

// TestMarkerWatch: a marker split across writes is seen; first stays, last
// moves on.
func TestMarkerWatch(t *testing.T) {
	m := &markerWatch{start: time.Now(), marker: []byte("NESTED-ALIVE tok")}
	_, _ = m.Write([]byte("output NESTED-AL"))
	first, _ := m.seen()
	assert.Zero(t, first, "half a marker is not a marker")
	_, _ = m.Write([]byte("IVE tok uptime=3\n"))
	first, last := m.seen()
	require.NotZero(t, first, "the split marker")
	time.Sleep(10 * time.Millisecond)
	_, _ = m.Write([]byte("NESTED-ALIVE tok uptime=4\n"))
	first2, last2 := m.seen()
	assert.Equal(t, first, first2)
	assert.Greater(t, last2, last)
}

// TestWatchHeartbeat: a payload whose heartbeat stops counts as stalled; one
// that keeps beating, or has not begun, does not.
func TestWatchHeartbeat(t *testing.T) {
	run := func(t *testing.T, began bool, beat time.Duration) bool {
		start := time.Now()
		begin := &markerWatch{start: start, marker: []byte("BEGIN tok")}
		alive := &markerWatch{start: start, marker: []byte("ALIVE tok")}
		if began {
			_, _ = begin.Write([]byte("BEGIN tok\n"))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if beat > 0 {
			go func() {
				for ctx.Err() == nil {
					_, _ = alive.Write([]byte("ALIVE tok\n")) // one writer, as lockedWriter makes it
					time.Sleep(beat)
				}
			}()
		}
		stalled := make(chan time.Duration, 1)
		watchHeartbeat(ctx, begin, alive, 500*time.Millisecond, 50*time.Millisecond, func(d time.Duration) { stalled <- d })
		select {
		case d := <-stalled:
			assert.GreaterOrEqual(t, d, 500*time.Millisecond)
			return true
		default:
			return false
		}
	}
	assert.True(t, run(t, true, 0), "no heartbeat after the payload began")
	assert.False(t, run(t, true, 100*time.Millisecond), "a steady heartbeat")
	assert.False(t, run(t, false, 0), "nothing is judged before the payload begins")
}
