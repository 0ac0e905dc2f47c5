package bench

import (
	"math"
	"slices"
	"time"
)

// Summary is the spread of one phase's samples.
type Summary struct {
	N      int           `json:"n"`
	Min    time.Duration `json:"-"`
	Median time.Duration `json:"-"`
	Max    time.Duration `json:"-"`
}

// Summarize returns min, median and max of samples (the median of an even
// count is the mean of the two middle samples). No samples: the zero Summary.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	n := len(s)
	median := s[n/2]
	if n%2 == 0 {
		median = s[n/2-1] + (s[n/2]-s[n/2-1])/2
	}
	return Summary{N: n, Min: s[0], Median: median, Max: s[n-1]}
}

// Ratio is ours/peer; NaN when either is missing or the peer is zero, so a
// ratio is never invented from absent data.
func Ratio(ours, peer time.Duration) float64 {
	if ours <= 0 || peer <= 0 {
		return math.NaN()
	}
	return float64(ours) / float64(peer)
}

// medianInt64 is Summarize for byte counts.
func summarizeInt64(samples []int64) (lo, median, hi int64) {
	if len(samples) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	n := len(s)
	median = s[n/2]
	if n%2 == 0 {
		median = s[n/2-1] + (s[n/2]-s[n/2-1])/2
	}
	return s[0], median, s[n-1]
}

// roundRatio rounds a ratio or speed-up to the thousandths a report keeps.
func roundRatio(r float64) float64 { return math.Round(r*1000) / 1000 }
