package main

import "testing"

// The A/B's verdict: slower when the median of the per-round ratios is under 0.97 and
// under 1 by more than the rounds' own spread; not for a difference that the rounds'
// noise could make, nor for one too small to matter.
func TestCompareFlagsASlowerBuildAndNotItsNoise(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		ratios []float64
		slower bool
	}{
		{"a replay at 0.91, the rounds agreeing", []float64{0.93, 0.90, 0.91, 0.88, 0.95}, true},
		{"a replay at 0.91, one wild round", []float64{0.91, 0.90, 1.20, 0.92, 0.89}, true},
		{"issue 50's README path, four rounds", []float64{0.96, 0.93, 0.86, 0.95}, true},
		{"0.96, the rounds agreeing", []float64{0.96, 0.95, 0.96, 0.97, 0.96}, true},
		{"0.98: too small to matter", []float64{0.98, 0.97, 0.98, 0.99, 0.98}, false},
		{"0.94, the rounds scattering wider", []float64{0.80, 0.94, 1.10, 0.85, 1.05}, false},
		{"faster", []float64{1.02, 1.05, 0.99, 1.03, 1.01}, false},
	}
	for _, tc := range cases {
		a := make([]float64, len(tc.ratios))
		b := make([]float64, len(tc.ratios))
		for i, r := range tc.ratios {
			a[i], b[i] = 1000, 1000*r
		}
		if s := compare(tc.name, a, b); s.Slower != tc.slower {
			t.Errorf("%s: median %.3f, spread %.3f: slower = %v, want %v", tc.name, s.Median, s.Spread, s.Slower, tc.slower)
		}
	}
}
