package nested

import "time"

// Bounds of a TSC rate hostTSCkHz believes (100 MHz .. 10 GHz), and the
// rate assumed when it cannot measure one.
const (
	minTSCkHz     = 100_000
	maxTSCkHz     = 10_000_000
	defaultTSCkHz = 2_000_000
	tscWindow     = 100 * time.Millisecond
)

// hostTSCkHz measures the host's TSC rate against its monotonic clock
// over window, in kHz; defaultTSCkHz when it cannot (not amd64, or an
// implausible figure). Under TCG the outer guest's TSC is the host's, so
// this is the rate the outer kernel must be told (tsc_early_khz): it
// cannot calibrate one itself (no HPET, no ACPI PM timer on microvm), and
// a wrong one makes its clock run fast or slow by the ratio (2 GHz for a
// 2.096 GHz TSC: measured 4.8 to 7.7 % fast against the host).
func hostTSCkHz(window time.Duration) int64 {
	if !haveTSC {
		return defaultTSCkHz
	}
	t0, c0 := time.Now(), rdtsc()
	time.Sleep(window)
	c1, elapsed := rdtsc(), time.Since(t0)
	if c1 <= c0 || elapsed <= 0 {
		return defaultTSCkHz
	}
	khz := int64(float64(c1-c0) / elapsed.Seconds() / 1000)
	if khz < minTSCkHz || khz > maxTSCkHz {
		return defaultTSCkHz
	}
	return khz
}
