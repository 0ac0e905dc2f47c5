package guestboot_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/bench"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm"
)

// ARM64BenchMarker starts the figure lines TestBootARM64Bench logs, which
// testharness/nested's TestNestedARM64BootGuestKernel records.
const ARM64BenchMarker = "ARM64BOOT "

// EnvRounds overrides TestBootARM64Bench's number of rounds.
const EnvRounds = "GUESTBOOT_ROUNDS"

// arm64Run is one timed boot with the work its VMM did up to the ready line.
type arm64Run struct {
	boot guestboot.Boot
	work bench.Work
}

// TestBootARM64Bench boots the arm64 guest kernel with testinit on our
// VMM and on qemu-system-aarch64 -M virt -accel kvm -cpu host, the same
// Image and initramfs, interleaved over rounds (the order alternating),
// and reports the wall time to testinit's ready line and, up to that
// line, the VM's KVM exits by counter (debugfs, summed over the VM) and
// the VMM's CPU time. Our VMM runs in this process, so its CPU time is
// this process's. It runs where the arm64 harness runs it (testharness/
// nested TestNestedARM64BootGuestKernel), or on an arm64 host whose KVM
// boots Linux.
func TestBootARM64Bench(t *testing.T) {
	if runtime.GOARCH != "arm64" {
		t.Skip("an arm64 bench: testharness/nested TestNestedARM64BootGuestKernel runs it in the arm64 harness")
	}
	nested.RequireLinuxBoot(t, "testharness/nested TestNestedARM64BootGuestKernel")
	kernelPath, initrd := os.Getenv(guestboot.EnvKernel), os.Getenv(guestboot.EnvInitrd)
	if kernelPath == "" || initrd == "" {
		t.Skipf("%s and %s name the arm64 Image and testinit's initramfs", guestboot.EnvKernel, guestboot.EnvInitrd)
	}
	if _, err := exec.LookPath("qemu-system-aarch64"); err != nil {
		t.Skip("no qemu-system-aarch64")
	}
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv(EnvRounds)); err == nil && v > 0 {
		rounds = v
	}
	runs := map[string][]arm64Run{}
	for r := 0; r < rounds; r++ {
		order := []string{guestboot.VMMCowork, guestboot.VMMQemuVirt}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, who := range order {
			var run arm64Run
			var err error
			if who == guestboot.VMMCowork {
				run, err = bootOursARM64(kernelPath, initrd)
			} else {
				run, err = bootQemuVirt(kernelPath, initrd)
			}
			if err != nil {
				t.Errorf("round %d, %s: %v", r+1, who, err)
				continue
			}
			t.Logf("round %d: %s; to ready: %v", r+1, run.boot.FigureLine(), run.work)
			runs[who] = append(runs[who], run)
		}
	}
	lines := arm64BenchFigures(runs)
	for _, l := range lines {
		t.Log(l)
	}
	require.NotEmpty(t, runs[guestboot.VMMQemuVirt], "qemu virt never booted")
	nested.RecordLinuxBoot(t)
}

// bootOursARM64 boots the test guest on our VMM (package machine, one
// vCPU), sampling this process's work when the ready line arrives.
func bootOursARM64(kernelPath, initrd string) (arm64Run, error) {
	var meter bench.WorkMeter
	pid := os.Getpid()
	before := meter.Sample(pid)
	var mu sync.Mutex
	var atReady bench.WorkSample
	start := time.Now()
	watch := guestboot.NewConsoleWatcherNotify(start, func() {
		s := meter.SampleCPUFirst(pid)
		mu.Lock()
		atReady = s
		mu.Unlock()
	})
	m, err := machine.New(machine.Config{Kernel: kernelPath, Initrd: initrd, CPUs: 1, MemMiB: 512, Console: watch})
	if err != nil {
		return arm64Run{}, err
	}
	if err := m.Start(); err != nil {
		m.Stop()
		return arm64Run{}, err
	}
	var exit vmm.Exit
	select {
	case <-m.Done():
		exit = m.Wait()
	case <-time.After(3 * time.Minute):
	}
	run := arm64Run{boot: guestboot.Boot{VMM: guestboot.VMMCowork, CPUs: 1, Exit: time.Since(start)}}
	run.boot.BootTimer, _ = m.BootTime()
	if _, err := m.Stop(); err != nil {
		return run, err
	}
	var ok bool
	run.boot.Ready, run.boot.GuestUptime, run.boot.GuestCPUs, ok = watch.Ready()
	if !ok {
		return run, fmt.Errorf("testinit never reported; exit %v; console:\n%s", exit, guestboot.TailLines(watch.Console(), 40))
	}
	mu.Lock()
	run.work = atReady.Sub(before)
	mu.Unlock()
	if !exit.Clean() {
		return run, fmt.Errorf("the VM ended with %v", exit)
	}
	return run, nil
}

// bootQemuVirt boots the test guest on qemu -M virt (one vCPU), sampling
// qemu's work when the ready line arrives.
func bootQemuVirt(kernelPath, initrd string) (arm64Run, error) {
	var meter bench.WorkMeter
	var pid atomic.Int64
	var mu sync.Mutex
	var atReady bench.WorkSample
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := guestboot.QemuVirt(ctx, guestboot.QemuOptions{
		Kernel: kernelPath, Initrd: initrd, CPUs: 1, MemMiB: 512,
		OnStart: func(p int) { pid.Store(int64(p)) },
		OnReady: func() {
			if p := int(pid.Load()); p != 0 {
				s := meter.SampleCPUFirst(p)
				mu.Lock()
				atReady = s
				mu.Unlock()
			}
		},
	})
	mu.Lock()
	defer mu.Unlock()
	return arm64Run{boot: b, work: atReady.Sub(bench.ZeroSample(start))}, err
}

// arm64BenchFigures summarises the runs: per VMM the median ready time,
// guest uptime at the ready line, CPU time and exits by counter (each a
// median on its own); then the ratios ours/qemu.
func arm64BenchFigures(runs map[string][]arm64Run) []string {
	type summary struct {
		ready, cpu, uptime time.Duration
		exits              map[string]int64
		n                  int
		exitsNote          string
	}
	sums := map[string]summary{}
	var lines []string
	for _, who := range []string{guestboot.VMMCowork, guestboot.VMMQemuVirt} {
		rs := runs[who]
		if len(rs) == 0 {
			lines = append(lines, ARM64BenchMarker+who+": no successful boot")
			continue
		}
		s := summary{n: len(rs), exits: map[string]int64{}}
		s.ready = medianDuration(rs, func(r arm64Run) time.Duration { return r.boot.Ready })
		s.cpu = medianDuration(rs, func(r arm64Run) time.Duration { return r.work.CPU })
		s.uptime = medianDuration(rs, func(r arm64Run) time.Duration { return r.boot.GuestUptime })
		var parts []string
		for _, c := range append(bench.ExitCounters, bench.ExitCounter{Name: bench.IOExitsKey}) {
			vals := make([]int64, 0, len(rs))
			for _, r := range rs {
				if r.work.Exits != nil {
					vals = append(vals, r.work.Exits[c.Name])
				} else {
					s.exitsNote = r.work.ExitsErr
				}
			}
			if len(vals) == 0 {
				continue
			}
			slices.Sort(vals)
			s.exits[c.Name] = vals[len(vals)/2]
			parts = append(parts, fmt.Sprintf("%s=%d", c.Name, s.exits[c.Name]))
		}
		if s.exitsNote != "" {
			parts = append(parts, "exits-note="+strings.ReplaceAll(s.exitsNote, " ", "_"))
		}
		sums[who] = s
		lines = append(lines, fmt.Sprintf("%s%s: rounds=%d ready_ms=%.1f guest_uptime_ms=%.0f cpu_ms=%.0f %s", ARM64BenchMarker, who, s.n,
			float64(s.ready)/1e6, float64(s.uptime)/1e6, float64(s.cpu)/1e6, strings.Join(parts, " ")))
	}
	ours, haveOurs := sums[guestboot.VMMCowork]
	q, haveQemu := sums[guestboot.VMMQemuVirt]
	if haveOurs && haveQemu && q.ready > 0 {
		line := fmt.Sprintf("%sratio ours/qemu: ready %.2f", ARM64BenchMarker, float64(ours.ready)/float64(q.ready))
		if q.cpu > 0 {
			line += fmt.Sprintf(" cpu %.2f", float64(ours.cpu)/float64(q.cpu))
		}
		if q.exits["exits"] > 0 {
			line += fmt.Sprintf(" exits %.2f", float64(ours.exits["exits"])/float64(q.exits["exits"]))
		}
		if q.exits[bench.IOExitsKey] > 0 {
			line += fmt.Sprintf(" %s %.2f", bench.IOExitsKey, float64(ours.exits[bench.IOExitsKey])/float64(q.exits[bench.IOExitsKey]))
		}
		lines = append(lines, line)
	}
	return lines
}

// medianDuration is the median of f over rs (the upper one of an even
// count).
func medianDuration(rs []arm64Run, f func(arm64Run) time.Duration) time.Duration {
	vals := make([]time.Duration, len(rs))
	for i, r := range rs {
		vals[i] = f(r)
	}
	slices.Sort(vals)
	return vals[len(vals)/2]
}
