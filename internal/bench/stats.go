package bench

import (
	"math"
	"slices"
	"time"
)

// Stat summarises one measured quantity: the latencies of single samples (their
// median is their p50, and they have a p99), or the result of each repeat of a whole
// measurement (a rate, a size), which has no p99.
type Stat struct {
	N      int      `json:"n"`
	Median float64  `json:"median"`
	P99    *float64 `json:"p99,omitempty"`
	Min    float64  `json:"min"`
	Max    float64  `json:"max"`
}

// summarize returns the Stat of xs; withP99 for samples of a distribution.
func summarize(xs []float64, withP99 bool) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	st := Stat{N: len(s), Median: median(s), Min: s[0], Max: s[len(s)-1]}
	if withP99 {
		p := percentile(s, 99)
		st.P99 = &p
	}
	return st
}

// median of sorted values: the middle one, or the mean of the two middle ones.
func median(sorted []float64) float64 {
	mid := len(sorted) / 2
	if len(sorted)%2 == 1 {
		return sorted[mid]
	}
	return (sorted[mid-1] + sorted[mid]) / 2
}

// percentile of sorted values by the nearest-rank method: a value that was
// measured, never one interpolated between two.
func percentile(sorted []float64, p float64) float64 {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }
