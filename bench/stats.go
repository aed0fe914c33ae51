package main

import (
	"slices"
)

// spread summarises repeated measurements of one figure: a busy machine
// makes any single round an anecdote, so the report gives the median and
// how far the rounds strayed from it.
type spread struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Values []float64 `json:"values"` // in the order measured
}

// summarize is the spread of xs (the zero spread when xs is empty).
func summarize(xs []float64) spread {
	if len(xs) == 0 {
		return spread{Values: []float64{}}
	}
	return spread{Median: median(xs), Min: slices.Min(xs), Max: slices.Max(xs), Values: slices.Clone(xs)}
}

// median is the middle value of xs, or the mean of the two middle values
// when there is an even number of them; 0 for none.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	switch n := len(s); {
	case n == 0:
		return 0
	case n%2 == 1:
		return s[n/2]
	default:
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// ratios is a[i] / b[i] for each pair (the shorter length).
func ratios(a, b []float64) []float64 {
	out := make([]float64, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]/b[i])
	}
	return out
}
