package latency

import "time"

const (
	first = 5 * time.Microsecond
	count = 24
)

// Bounds returns the upper bounds of the buckets, ascending: 5 µs × 2^i for
// i = 0 … 23 (the last is 41.94 s). A histogram counts an observation in the
// first bucket whose bound it does not exceed; above the last bound it goes
// to +Inf. The slice is new: the caller may keep it.
func Bounds() []time.Duration {
	b := make([]time.Duration, count)
	for i := range b {
		b[i] = first << i
	}
	return b
}

// Seconds returns Bounds in seconds, for prometheus.HistogramOpts.Buckets.
func Seconds() []float64 {
	b := Bounds()
	s := make([]float64, len(b))
	for i, d := range b {
		s[i] = d.Seconds()
	}
	return s
}
